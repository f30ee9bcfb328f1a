//! Method ids: one associated const per method on `<Trait>Client`, and a compile-time uniqueness check.
//!
//! Ids hash `"Trait.method(arg:Type,..)->Output"`: names and types, never declaration order.

use proc_macro2::TokenStream;
use quote::quote;

use super::{method_id_const, Context};
use crate::method_id::signature;
use crate::model::ServiceDef;

/// `impl KvClient { pub const GET: MethodId = method_id("Kv.get"); .. }`.
pub(super) fn method_id_consts(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let Context { krate, client_ident, .. } = ctx;
    let consts = service.methods.iter().map(|method| {
        let constant = method_id_const(method);
        let signature = signature(&service.name(), method);
        let doc = format!(
            "Method id of `{signature}`: the 32-bit FNV-1a hash of that signature, as sent on the wire."
        );
        quote! {
            #[doc = #doc]
            pub const #constant: #krate::MethodId = #krate::__private::method_id(#signature);
        }
    });
    quote! {
        impl #client_ident {
            #(#consts)*
        }
    }
}

/// `const _: () = assert_unique_ids(&[..]);`, a backstop to the macro's own collision check.
pub(super) fn unique_ids_assertion(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let krate = &ctx.krate;
    let ids = service.methods.iter().map(|method| ctx.method_id_path(method));
    quote! {
        const _: () = #krate::__private::assert_unique_ids(&[#(#ids),*]);
    }
}
