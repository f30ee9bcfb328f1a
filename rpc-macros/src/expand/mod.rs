//! Turns a validated [`ServiceDef`] into code: one generator per emitted item.

mod client;
mod ids;
mod server;
mod trait_def;

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};
use syn::{ItemTrait, Path};

use crate::args::ServiceArgs;
use crate::method_id::const_name;
use crate::model::{MethodDef, ServiceDef};

/// Expands `#[service(attr)] item`.
pub(crate) fn service(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let args = ServiceArgs::parse(attr);
    // The context type is recognised under the crate path the expansion uses.
    let krate = args.as_ref().map_or_else(|_| ServiceArgs::default_krate(), |a| a.krate.clone());
    let service = parse_trait(item).and_then(|item| ServiceDef::from_trait(item, &krate));
    let (args, service) = match (args, service) {
        (Ok(args), Ok(service)) => (args, service),
        (Err(mut a), Err(b)) => {
            a.combine(b);
            return Err(a);
        }
        (Err(err), _) | (_, Err(err)) => return Err(err),
    };
    let ctx = Context::new(args.krate, &service);
    let trait_def = trait_def::service_trait(&ctx, &service);
    let client = client::client_stub(&ctx, &service);
    let ids = ids::method_id_consts(&ctx, &service);
    let unique = ids::unique_ids_assertion(&ctx, &service);
    let server = server::server_dispatcher(&ctx, &service);
    Ok(quote! { #trait_def #client #ids #unique #server })
}

fn parse_trait(item: TokenStream) -> syn::Result<ItemTrait> {
    syn::parse2(item.clone()).map_err(|_| {
        syn::Error::new_spanned(
            // Point at the item's head (`struct`, `fn`, ..) rather than its whole body.
            item.into_iter().take(2).collect::<TokenStream>(),
            "`#[service]` can only be applied to a trait",
        )
    })
}

/// Names shared by the generators.
struct Context {
    /// Path to the rpc-core library (`::rpc_core` or the `crate = ".."` argument).
    krate: Path,
    /// The service trait.
    trait_ident: Ident,
    /// `<Trait>Client`.
    client_ident: Ident,
    /// `<Trait>Server`.
    server_ident: Ident,
    /// Generic parameter of the server struct, chosen not to shadow a type the signatures use.
    server_param: Ident,
    /// Generic parameter of the server's dispatcher (where it puts a handler's future), chosen
    /// likewise.
    place_param: Ident,
}

impl Context {
    fn new(krate: Path, service: &ServiceDef) -> Self {
        let trait_ident = service.ident.clone();
        let span = trait_ident.span();
        Context {
            krate,
            client_ident: format_ident!("{}Client", trait_ident, span = span),
            server_ident: format_ident!("{}Server", trait_ident, span = span),
            server_param: fresh_type_param(service, "S"),
            place_param: fresh_type_param(service, "P"),
            trait_ident,
        }
    }

    /// `<Trait>Client::<METHOD>`, the path of a method's id constant.
    fn method_id_path(&self, method: &MethodDef) -> TokenStream {
        let client = &self.client_ident;
        let constant = method_id_const(method);
        quote!(#client::#constant)
    }
}

/// Name of a method's id constant, e.g. `GET` for `get`.
fn method_id_const(method: &MethodDef) -> Ident {
    format_ident!("{}", const_name(&method.name()), span = method.ident.span())
}

/// `base` (`S`, `P`), unless the trait or a signature already uses that name (then `S_`, `S__`,
/// ..). The two bases differ in their first letter, so they never meet.
fn fresh_type_param(service: &ServiceDef, base: &str) -> Ident {
    let mut used = ids_in_signatures(service);
    used.push(service.ident.to_string());
    let mut name = String::from(base);
    while used.contains(&name) {
        name.push('_');
    }
    Ident::new(&name, Span::call_site())
}

fn ids_in_signatures(service: &ServiceDef) -> Vec<String> {
    let types = service.methods.iter().flat_map(|m| m.args.iter().map(|a| &a.ty).chain([&m.output]));
    let tokens: TokenStream = types.map(|ty| quote!(#ty)).collect();
    let mut idents = Vec::new();
    collect_idents(tokens, &mut idents);
    idents
}

fn collect_idents(tokens: TokenStream, into: &mut Vec<String>) {
    for tree in tokens {
        match tree {
            proc_macro2::TokenTree::Ident(ident) => into.push(ident.to_string()),
            proc_macro2::TokenTree::Group(group) => collect_idents(group.stream(), into),
            _ => {}
        }
    }
}

/// Whether `ty` is written as `bytes::Bytes` (`Bytes`, `bytes::Bytes`, `::bytes::Bytes`, or the
/// crate's re-export): such arguments and results are decoded as `SharedBytes`, a slice of the
/// received payload (no copy) when larger than 1 KiB, and converted back. Same wire format.
pub(crate) fn is_bytes(ty: &syn::Type) -> bool {
    let syn::Type::Path(p) = ty else { return false };
    if p.qself.is_some() {
        return false;
    }
    let segs: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
    let plain = p.path.segments.iter().all(|s| s.arguments.is_none());
    plain
        && match segs.as_slice() {
            [last] => last == "Bytes",
            [.., module, last] => {
                last == "Bytes" && matches!(module.as_str(), "bytes" | "__private" | "rpc_core")
            }
            [] => false,
        }
}

/// The type a value of `ty` is decoded as: `SharedBytes` for `Bytes`, else `ty` itself.
pub(super) fn wire_type(krate: &Path, ty: &syn::Type) -> TokenStream {
    if is_bytes(ty) {
        quote::quote!(#krate::__private::SharedBytes)
    } else {
        quote::quote!(#ty)
    }
}
