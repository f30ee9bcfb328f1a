//! `<Trait>Server<S>`: wraps an implementation of the trait and dispatches requests to it.

use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;
use syn::ext::IdentExt;

use super::Context;
use crate::method_id::qualified_name;
use crate::model::{MethodDef, ServiceDef};

/// The server struct, its constructors, `Clone`/`Debug` and its `rpc_core::Service` impl.
pub(super) fn server_dispatcher(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let server_struct = server_struct(ctx, service);
    let std_impls = server_std_impls(ctx);
    let service_impl = service_impl(ctx, service);
    quote! { #server_struct #std_impls #service_impl }
}

fn server_struct(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let Context { krate, trait_ident, server_ident, server_param: s, .. } = ctx;
    let vis = &service.vis;
    let doc = format!(
        "Server side of the [`{trait_ident}`] service: decodes each request, runs the matching method of \
         the wrapped implementation and encodes its result.\n\nHand it to the rpc-core server to serve it."
    );
    quote! {
        #[doc = #doc]
        #vis struct #server_ident<#s> {
            inner: #krate::__private::Arc<#s>,
        }

        impl<#s: #trait_ident> #server_ident<#s> {
            /// Wraps `service` so it can be served.
            pub fn new(service: #s) -> Self {
                Self { inner: #krate::__private::Arc::new(service) }
            }

            /// Wraps an already shared implementation.
            pub fn from_arc(service: #krate::__private::Arc<#s>) -> Self {
                Self { inner: service }
            }
        }
    }
}

/// `Clone` and `Debug` without requiring them of the implementation.
fn server_std_impls(ctx: &Context) -> TokenStream {
    let Context { server_ident, server_param: s, .. } = ctx;
    let name = server_ident.to_string();
    quote! {
        impl<#s> ::core::clone::Clone for #server_ident<#s> {
            fn clone(&self) -> Self {
                Self { inner: ::core::clone::Clone::clone(&self.inner) }
            }
        }

        impl<#s> ::core::fmt::Debug for #server_ident<#s> {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(#name).finish_non_exhaustive()
            }
        }
    }
}

/// The dispatcher (`__dispatch`, generic over where it puts the handler's future) and the
/// `rpc_core::Service` impl, whose `call` boxes the future and `call_in` puts it in the box the
/// server lends.
fn service_impl(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let Context { krate, trait_ident, server_ident, server_param: s, place_param: p, .. } = ctx;
    let service_name = service.name();
    let descs = service.methods.iter().map(|method| method_desc(ctx, method));
    // Mixed-site names can't be shadowed by (or shadow) the user's argument names.
    let method_var = Ident::new("method", Span::mixed_site());
    let payload = Ident::new("payload", Span::mixed_site());
    let place = Ident::new("place", Span::mixed_site());
    let slot = Ident::new("slot", Span::mixed_site());
    let arms = service.methods.iter().map(|method| dispatch_arm(ctx, method, &payload, &place));
    let discard_payload = service.methods.is_empty().then(|| quote!(let _ = #payload;));
    quote! {
        impl<#s: #trait_ident> #server_ident<#s> {
            /// Runs one request, its future put where `place` says.
            fn __dispatch<#p: #krate::__private::Place>(
                &self,
                #method_var: #krate::MethodId,
                #payload: #krate::__private::Received,
                #place: #p,
            ) -> <#p as #krate::__private::Place>::Placed {
                match #method_var {
                    #(#arms)*
                    _ => {
                        #discard_payload
                        #krate::__private::unknown_method(#service_name, #method_var, #place)
                    }
                }
            }
        }

        impl<#s: #trait_ident> #krate::Service for #server_ident<#s> {
            fn name(&self) -> &'static str {
                #service_name
            }

            fn methods(&self) -> &[#krate::MethodDesc] {
                const METHODS: &[#krate::MethodDesc] = &[#(#descs),*];
                METHODS
            }

            fn call(
                &self,
                #method_var: #krate::MethodId,
                #payload: #krate::__private::Received,
            ) -> #krate::__private::BoxFuture<
                'static,
                ::core::result::Result<#krate::__private::Bytes, #krate::ServiceError>,
            > {
                self.__dispatch(#method_var, #payload, #krate::__private::Boxed)
            }

            fn call_in(
                &self,
                #method_var: #krate::MethodId,
                #payload: #krate::__private::Received,
                #slot: #krate::FutureSlot<'_>,
            ) -> #krate::ServiceFuture {
                self.__dispatch(#method_var, #payload, #slot)
            }
        }
    }
}

/// `MethodDesc { name: "get", full_name: "Kv.get", id: KvClient::GET, max_response: .., inline: .. }`.
fn method_desc(ctx: &Context, method: &MethodDef) -> TokenStream {
    let krate = &ctx.krate;
    let name = method.name();
    let full_name = qualified_name(&ctx.trait_ident.unraw().to_string(), &name);
    let id = ctx.method_id_path(method);
    let output = &method.output;
    let inline = method.inline;
    quote!(#krate::MethodDesc {
        name: #name,
        full_name: #full_name,
        id: #id,
        max_response: #krate::response_bound::<#output>(),
        inline: #inline,
    })
}

/// `KvClient::GET => { let inner = ..; serve(payload, place, move |(key,): (String,)| async move { .. }) }`.
fn dispatch_arm(ctx: &Context, method: &MethodDef, payload: &Ident, place: &Ident) -> TokenStream {
    let Context { krate, trait_ident, server_param: s, .. } = ctx;
    let id = ctx.method_id_path(method);
    let ident = &method.ident;
    let inner = Ident::new("inner", Span::mixed_site());
    let names: Vec<_> = method.args.iter().map(|arg| &arg.ident).collect();
    // `Bytes` arguments are decoded as slices of the payload (see `is_bytes`).
    let types = method.args.iter().map(|arg| super::wire_type(krate, &arg.ty));
    let values = method.args.iter().map(|arg| {
        let name = &arg.ident;
        if super::is_bytes(&arg.ty) {
            quote!(#name.0)
        } else {
            quote!(#name)
        }
    });
    // The call's context, taken inside the handler's task (where the server put it).
    let context = method.context.as_ref().map(|_| quote!(#krate::__private::current_context(),));
    quote! {
        #id => {
            let #inner = ::core::clone::Clone::clone(&self.inner);
            #krate::__private::serve(#payload, #place, move |(#(#names,)*): (#(#types,)*)| async move {
                <#s as #trait_ident>::#ident(&*#inner, #context #(#values),*).await
            })
        }
    }
}
