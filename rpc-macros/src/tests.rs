//! Unit tests of parsing, validation and expansion on token streams (no compiler involved; the
//! trybuild tests in rpc-core/tests/macro_ui.rs compile real expansions).

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand;

fn expand_ok(attr: TokenStream, item: TokenStream) -> String {
    match expand::service(attr, item) {
        Ok(tokens) => tokens.to_string(),
        Err(err) => panic!("expected success, got: {err}"),
    }
}

/// Every error message of a failed expansion.
fn expand_errors(attr: TokenStream, item: TokenStream) -> Vec<String> {
    match expand::service(attr, item) {
        Ok(tokens) => panic!("expected an error, got: {tokens}"),
        Err(err) => err.into_iter().map(|e| e.to_string()).collect(),
    }
}

fn assert_single_error(item: TokenStream, expected: &str) {
    let errors = expand_errors(quote!(), item);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains(expected), "{:?} doesn't contain {expected:?}", errors[0]);
}

#[test]
fn expansion_emits_trait_client_server_and_ids() {
    let out = expand_ok(
        quote!(),
        quote! {
            pub trait Kv {
                async fn get(&self, key: String) -> Option<Vec<u8>>;
                async fn ping(&self);
            }
        },
    );
    for expected in [
        "pub trait Kv : :: core :: marker :: Send + :: core :: marker :: Sync + 'static",
        "fn get (& self , key : String) -> impl :: core :: future :: Future < Output = Option < Vec < u8 > > >",
        "fn ping (& self ,) -> impl :: core :: future :: Future < Output = () >",
        "pub struct KvClient",
        "pub const GET : :: rpc_core :: MethodId = :: rpc_core :: __private :: method_id (\"Kv.get(key:String)->Option<Vec<u8>>\")",
        "pub const PING",
        "static __RPC_CORE_METHOD : :: rpc_core :: __private :: ClientMethod = :: rpc_core :: __private :: ClientMethod :: new (\"Kv.get\")",
        ":: rpc_core :: __private :: call (& self . client , & self . opts , KvClient :: GET , & __RPC_CORE_METHOD , & (key ,))",
        ":: rpc_core :: __private :: call (& self . client , & self . opts , KvClient :: PING , & __RPC_CORE_METHOD , & ())",
        ":: rpc_core :: MethodDesc { name : \"get\" , full_name : \"Kv.get\" , id : KvClient :: GET , max_response : :: rpc_core :: response_bound :: < Option < Vec < u8 > > > () , inline : false , }",
        "assert_unique_ids (& [KvClient :: GET , KvClient :: PING])",
        "pub struct KvServer < S >",
        "impl < S : Kv > :: rpc_core :: Service for KvServer < S >",
        "move | (key ,) : (String ,) | async move",
        "< S as Kv > :: get (& * inner , key) . await",
        "_ => { :: rpc_core :: __private :: unknown_method (\"Kv\" , method , place) }",
        "fn __dispatch < P : :: rpc_core :: __private :: Place > (& self , method : :: rpc_core :: MethodId , payload : :: rpc_core :: __private :: Received , place : P ,) -> < P as :: rpc_core :: __private :: Place > :: Placed",
        ":: rpc_core :: __private :: serve (payload , place , move | (key ,) : (String ,) | async move",
        "self . __dispatch (method , payload , :: rpc_core :: __private :: Boxed)",
        "fn call_in (& self , method : :: rpc_core :: MethodId , payload : :: rpc_core :: __private :: Received , slot : :: rpc_core :: FutureSlot < '_ > ,) -> :: rpc_core :: ServiceFuture { self . __dispatch (method , payload , slot) }",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}

#[test]
fn rpc_inline_marks_the_method_desc_and_leaves_the_trait() {
    let out = expand_ok(
        quote!(),
        quote! {
            pub trait Kv {
                /// Answers at once.
                #[rpc(inline)]
                async fn get(&self, key: u8) -> u8;
                async fn put(&self, key: u8);
            }
        },
    );
    assert!(out.contains("name : \"get\" , full_name : \"Kv.get\" , id : KvClient :: GET , max_response : :: rpc_core :: response_bound :: < u8 > () , inline : true ,"), "{out}");
    assert!(out.contains("name : \"put\" , full_name : \"Kv.put\" , id : KvClient :: PUT , max_response : :: rpc_core :: response_bound :: < () > () , inline : false ,"), "{out}");
    assert!(!out.contains("rpc (inline)"), "the trait as emitted keeps no `#[rpc]`: {out}");
    assert!(out.contains("# [doc = r\" Answers at once.\"] fn get"), "{out}");
}

#[test]
fn an_unknown_rpc_option_is_an_error_at_its_token() {
    assert_single_error(
        quote! {
            trait Kv {
                #[rpc(fast)]
                async fn get(&self) -> u8;
            }
        },
        "unknown `rpc` option",
    );
}

#[test]
fn crate_argument_replaces_every_rpc_core_path() {
    let out = expand_ok(
        quote!(crate = "::my_rpc"),
        quote!(
            trait Kv {
                async fn get(&self, k: u8) -> u8;
            }
        ),
    );
    assert!(!out.contains("rpc_core"), "{out}");
    assert!(out.contains(":: my_rpc :: __private :: serve"), "{out}");
    assert!(out.contains(":: my_rpc :: Client"), "{out}");
}

#[test]
fn user_supertraits_are_kept() {
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv: Clone {
                async fn get(&self);
            }
        ),
    );
    assert!(out.contains("trait Kv : Clone + :: core :: marker :: Send"), "{out}");
}

#[test]
fn server_type_param_avoids_names_the_signatures_use() {
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn get(&self, s: S) -> S_;
            }
        ),
    );
    assert!(out.contains("struct KvServer < S__ >"), "{out}");
    assert!(out.contains("< S__ as Kv > :: get"), "{out}");
}

#[test]
fn dispatcher_type_param_avoids_names_the_signatures_use() {
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn get(&self, p: P) -> Vec<P_>;
            }
        ),
    );
    assert!(out.contains("fn __dispatch < P__ : :: rpc_core :: __private :: Place >"), "{out}");
    assert!(out.contains("move | (p ,) : (P ,) |"), "{out}");
}

#[test]
fn ids_hash_names_not_positions() {
    let a = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn a(&self);
                async fn b(&self);
            }
        ),
    );
    let b = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn b(&self);
                async fn a(&self);
            }
        ),
    );
    let const_b =
        "pub const B : :: rpc_core :: MethodId = :: rpc_core :: __private :: method_id (\"Kv.b()->()\")";
    assert!(a.contains(const_b) && b.contains(const_b));
}

#[test]
fn raw_identifiers_are_unraw_in_names() {
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn r#type(&self);
            }
        ),
    );
    assert!(out.contains("method_id (\"Kv.type()->()\")"), "{out}");
    assert!(out.contains("pub const TYPE"), "{out}");
}

#[test]
fn undocumented_methods_get_a_generated_client_doc() {
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn get(&self);
            }
        ),
    );
    assert!(out.contains("Calls [`Kv::get`] on the remote service."), "{out}");
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                #[doc = "Mine."]
                async fn get(&self);
            }
        ),
    );
    assert!(!out.contains("Calls [`Kv::get`]"), "{out}");
    assert_eq!(out.matches("Mine.").count(), 2, "trait method and client method: {out}");
}

#[test]
fn non_trait_items_are_rejected() {
    let errors = expand_errors(
        quote!(),
        quote!(
            struct Kv;
        ),
    );
    assert!(errors[0].contains("can only be applied to a trait"), "{errors:?}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let errors = expand_errors(
        quote!(bogus),
        quote! {
            trait Kv<T> {
                fn a(&self);
                async fn b(self);
                type C;
            }
        },
    );
    assert_eq!(errors.len(), 5, "{errors:?}");
}

#[test]
fn unsupported_method_signatures_are_rejected() {
    let cases = [
        (
            quote!(
                trait Kv {
                    fn get(&self);
                }
            ),
            "must be `async fn`",
        ),
        (
            quote!(
                trait Kv {
                    async fn get();
                }
            ),
            "must take `&self`",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(k: u8);
                }
            ),
            "must take `&self`",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(self);
                }
            ),
            "by-value `self`",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&mut self);
                }
            ),
            "`&mut self` is not supported",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&'a self);
                }
            ),
            "lifetimes are not supported",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(self: Box<Self>);
                }
            ),
            "typed receivers",
        ),
        (
            quote!(
                trait Kv {
                    async fn get<T>(&self, t: T);
                }
            ),
            "generic methods",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self)
                    where
                        Self: Sized;
                }
            ),
            "where clauses",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, (a, b): (u8, u8));
                }
            ),
            "argument patterns",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, ref a: u8);
                }
            ),
            "argument patterns",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, _: u8);
                }
            ),
            "argument patterns",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, a: impl Clone);
                }
            ),
            "`impl Trait`",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, a: &str);
                }
            ),
            "references are not supported",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self) -> Vec<&'static str>;
                }
            ),
            "references are not supported",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, a: Cow<'a, str>);
                }
            ),
            "lifetimes are not supported",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self) -> Self;
                }
            ),
            "`Self` is not supported",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self) -> Vec<_>;
                }
            ),
            "`_` is not allowed",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self) {}
                }
            ),
            "default method bodies",
        ),
        (
            quote!(
                trait Kv {
                    const async fn get(&self);
                }
            ),
            "`const fn`",
        ),
        (
            quote!(
                trait Kv {
                    async unsafe fn get(&self);
                }
            ),
            "`unsafe fn`",
        ),
        (
            quote!(
                trait Kv {
                    #[cfg(test)]
                    async fn get(&self);
                }
            ),
            "`#[cfg]`",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self, #[allow(unused)] a: u8);
                }
            ),
            "attributes on",
        ),
        (
            quote!(
                trait Kv {
                    type T;
                }
            ),
            "associated types",
        ),
        (
            quote!(
                trait Kv {
                    const N: u8;
                }
            ),
            "associated consts",
        ),
        (
            quote!(
                trait Kv<T> {}
            ),
            "generic `#[service]` traits",
        ),
        (
            quote!(
                trait Kv
                where
                    Self: Sized,
                {
                }
            ),
            "where clauses",
        ),
        (
            quote!(
                unsafe trait Kv {}
            ),
            "can't be `unsafe`",
        ),
        (
            quote!(
                trait Kv {
                    async fn new(&self);
                }
            ),
            "clashes with the generated `KvClient::new`",
        ),
        (
            quote!(
                trait Kv {
                    async fn clone(&self);
                }
            ),
            "would shadow `Clone::clone` on the generated `KvClient`",
        ),
        (
            quote!(
                trait Kv {
                    async fn fmt(&self, f: u8);
                }
            ),
            "would shadow `Debug::fmt` on the generated `KvClient`",
        ),
        (
            quote!(
                trait Kv {
                    async fn GET(&self);
                }
            ),
            "clash with its id constant",
        ),
        (
            quote!(
                trait Kv {
                    async fn get(&self);
                    async fn Get(&self);
                }
            ),
            "share the id constant",
        ),
        (
            quote!(
                trait Clash {
                    async fn m_hdtrw(&self);
                    async fn m_vckxa(&self);
                }
            ),
            "collides with that of `Clash.m_hdtrw`",
        ),
    ];
    for (item, expected) in cases {
        assert_single_error(item, expected);
    }
}

#[test]
fn static_lifetimes_and_mut_bindings_are_accepted() {
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn get(&self, mut a: Cow<'static, str>);
            }
        ),
    );
    assert!(out.contains("fn get (& self , a : Cow < 'static , str >)"), "`mut` is dropped: {out}");
}

#[test]
fn every_name_the_client_already_has_is_rejected_at_the_method_name() {
    let names = [
        "new",
        "with_options",
        "client",
        "clone",
        "clone_from",
        "fmt",
        "to_owned",
        "clone_into",
        "borrow",
        "borrow_mut",
        "type_id",
        "from",
        "into",
        "try_from",
        "try_into",
    ];
    for name in names {
        let ident = proc_macro2::Ident::new(name, proc_macro2::Span::call_site());
        let errors = expand_errors(quote!(), quote!(trait Kv { async fn #ident(&self); }));
        assert_eq!(errors.len(), 1, "{name}: {errors:?}");
        assert!(errors[0].contains(&format!("method name `{name}`")), "{name}: {errors:?}");
    }
    // Names close to them are fine.
    expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn clone_object(&self);
                async fn format(&self);
            }
        ),
    );
}

#[test]
fn a_context_first_argument_is_passed_by_the_server_and_not_sent() {
    let out = expand_ok(
        quote!(),
        quote! {
            trait Kv {
                async fn get(&self, ctx: rpc_core::Context, key: String) -> u64;
                async fn ping(&self, cx: ::rpc_core::context::Context);
            }
        },
    );
    for expected in [
        "fn get (& self , ctx : rpc_core :: Context , key : String)",
        "fn ping (& self , cx : :: rpc_core :: context :: Context)",
        "pub async fn get (& self , key : String)",
        "pub async fn ping (& self ,)",
        "< S as Kv > :: get (& * inner , :: rpc_core :: __private :: current_context () , key) . await",
        "< S as Kv > :: ping (& * inner , :: rpc_core :: __private :: current_context () ,) . await",
        "method_id (\"Kv.get(key:String)->u64\")",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}

#[test]
fn the_context_is_recognised_under_the_crate_argument_only_as_a_path() {
    let out = expand_ok(
        quote!(crate = "::my_rpc"),
        quote!(
            trait Kv {
                async fn get(&self, ctx: my_rpc::Context);
            }
        ),
    );
    assert!(out.contains("pub async fn get (& self ,)"), "{out}");
    // A bare `Context` may be the user's own type: it is an ordinary argument.
    let out = expand_ok(
        quote!(),
        quote!(
            trait Kv {
                async fn get(&self, ctx: Context);
            }
        ),
    );
    assert!(out.contains("pub async fn get (& self , ctx : Context)"), "{out}");
}

#[test]
fn the_context_must_come_first() {
    assert_single_error(
        quote!(
            trait Kv {
                async fn get(&self, key: String, ctx: rpc_core::Context);
            }
        ),
        "the call context may only be the first argument after `&self`",
    );
    assert_single_error(
        quote!(
            trait Kv {
                async fn get(&self, (a, b): rpc_core::Context);
            }
        ),
        "argument patterns are not supported",
    );
}

#[test]
fn bytes_is_recognised_only_as_written_for_bytes() {
    use crate::expand::is_bytes;
    let ty = |s: &str| syn::parse_str::<syn::Type>(s).unwrap();
    for yes in ["Bytes", "bytes::Bytes", "::bytes::Bytes", "rpc_core::__private::Bytes", "rpc_core::Bytes"] {
        assert!(is_bytes(&ty(yes)), "{yes}");
    }
    for no in ["Vec<u8>", "mycrate::Bytes", "Bytes<u8>", "Option<Bytes>", "&[u8]", "BytesMut"] {
        assert!(!is_bytes(&ty(no)), "{no}");
    }
}
