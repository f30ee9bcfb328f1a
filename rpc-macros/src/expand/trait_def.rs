//! The user's trait, rewritten with `Send` futures and `Send + Sync + 'static` supertraits.

use proc_macro2::TokenStream;
use quote::quote;

use super::Context;
use crate::model::{MethodDef, ServiceDef};

/// `trait Kv: Send + Sync + 'static { fn get(&self, ..) -> impl Future<Output = ..> + Send; .. }`.
pub(super) fn service_trait(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let ServiceDef { attrs, vis, supertraits, methods, .. } = service;
    let ident = &ctx.trait_ident;
    let user_bounds = supertraits.iter();
    let methods = methods.iter().map(trait_method);
    quote! {
        #(#attrs)*
        #vis trait #ident: #(#user_bounds +)* ::core::marker::Send + ::core::marker::Sync + 'static {
            #(#methods)*
        }
    }
}

/// `fn get(&self, key: String) -> impl Future<Output = Option<Vec<u8>>> + Send;`.
fn trait_method(method: &MethodDef) -> TokenStream {
    let MethodDef { attrs, ident, context, args, output, .. } = method;
    let args = context.iter().chain(args).map(|arg| {
        let (name, ty) = (&arg.ident, &arg.ty);
        quote!(#name: #ty)
    });
    quote! {
        #(#attrs)*
        fn #ident(&self, #(#args),*)
            -> impl ::core::future::Future<Output = #output> + ::core::marker::Send;
    }
}
