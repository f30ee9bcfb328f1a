//! `<Trait>Client`: the typed stub that turns method calls into requests.

use proc_macro2::{Ident, Span, TokenStream};
use quote::quote;
use syn::ext::IdentExt;

use super::Context;
use crate::method_id::qualified_name;
use crate::model::{MethodDef, ServiceDef};

/// The client struct, its constructors and one `async fn` per service method.
pub(super) fn client_stub(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let Context { krate, client_ident, trait_ident, .. } = ctx;
    let vis = &service.vis;
    let struct_doc = format!(
        "Client stub of the [`{trait_ident}`] service: each method sends one request over a \
         connection and awaits its response.\n\nCheap to clone; clones share the connection."
    );
    let methods = service.methods.iter().map(|method| client_method(ctx, method));
    quote! {
        #[doc = #struct_doc]
        #[derive(::core::clone::Clone, ::core::fmt::Debug)]
        #vis struct #client_ident {
            client: #krate::Client,
            opts: #krate::CallOptions,
        }

        impl #client_ident {
            /// Creates a stub whose calls go over `client`, with default call options.
            pub fn new(client: #krate::Client) -> Self {
                Self { client, opts: <#krate::CallOptions as ::core::default::Default>::default() }
            }

            /// Returns a stub on the same connection whose calls use `opts` (e.g. a deadline).
            pub fn with_options(&self, opts: #krate::CallOptions) -> Self {
                Self { client: ::core::clone::Clone::clone(&self.client), opts }
            }

            /// The connection handle this stub sends its calls over.
            pub fn client(&self) -> &#krate::Client {
                &self.client
            }

            #(#methods)*
        }
    }
}

/// `pub async fn get(&self, key: String) -> Result<Option<Vec<u8>>, CallError>`.
fn client_method(ctx: &Context, method: &MethodDef) -> TokenStream {
    let krate = &ctx.krate;
    let MethodDef { ident, args, output, .. } = method;
    let params = args.iter().map(|arg| {
        let (name, ty) = (&arg.ident, &arg.ty);
        quote!(#name: #ty)
    });
    let arg_names = args.iter().map(|arg| &arg.ident);
    let id = ctx.method_id_path(method);
    let name = qualified_name(&ctx.trait_ident.unraw().to_string(), &method.name());
    let docs = client_method_docs(ctx, method);
    // The method's name and metric handles, registered once per process.
    let method_static = Ident::new("__RPC_CORE_METHOD", Span::mixed_site());
    let call =
        quote!(#krate::__private::call(&self.client, &self.opts, #id, &#method_static, &(#(#arg_names,)*)));
    // A `Bytes` result is decoded as a slice of the response (see `is_bytes`).
    let call = if super::is_bytes(output) {
        quote!(#call.await.map(|b: #krate::__private::SharedBytes| b.0))
    } else {
        quote!(#call.await)
    };
    quote! {
        #docs
        pub async fn #ident(&self, #(#params),*) -> ::core::result::Result<#output, #krate::CallError> {
            static #method_static: #krate::__private::ClientMethod = #krate::__private::ClientMethod::new(#name);
            #call
        }
    }
}

/// The trait method's docs, or a generated line if it has none (so `missing_docs` users don't break).
fn client_method_docs(ctx: &Context, method: &MethodDef) -> TokenStream {
    let docs: Vec<_> = method.doc_attrs().collect();
    if docs.is_empty() {
        let doc = format!("Calls [`{}::{}`] on the remote service.", ctx.trait_ident.unraw(), method.name());
        quote!(#[doc = #doc])
    } else {
        quote!(#(#docs)*)
    }
}
