//! Method ids: one associated const per method on `<Trait>Client`, and a compile-time uniqueness check.
//!
//! Ids hash `"Trait.method"`, so they depend on names only, never on declaration order.

use proc_macro2::TokenStream;
use quote::quote;

use super::{method_id_const, Context};
use crate::method_id::qualified_name;
use crate::model::ServiceDef;

/// `impl KvClient { pub const GET: MethodId = method_id("Kv.get"); .. }`.
pub(super) fn method_id_consts(ctx: &Context, service: &ServiceDef) -> TokenStream {
    let Context { krate, client_ident, .. } = ctx;
    let consts = service.methods.iter().map(|method| {
        let constant = method_id_const(method);
        let qualified = qualified_name(&service.name(), &method.name());
        let doc = format!("Method id of `{qualified}`: its 32-bit FNV-1a hash, as sent on the wire.");
        quote! {
            #[doc = #doc]
            pub const #constant: #krate::MethodId = #krate::__private::method_id(#qualified);
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
