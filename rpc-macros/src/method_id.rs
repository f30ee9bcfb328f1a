//! Method ids as the runtime computes them, so collisions are reported at the offending method.

use quote::ToTokens;
use syn::ext::IdentExt;

use crate::model::MethodDef;

/// FNV-1a, 32 bits, of a method's [`signature`].
///
/// Must stay identical to `rpc_core::__private::method_id`; the expansion also asks rpc-core to
/// re-check uniqueness at compile time (`assert_unique_ids`), so a divergence can't go unnoticed.
pub(crate) fn fnv1a_32(qualified_name: &str) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    qualified_name.bytes().fold(OFFSET_BASIS, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(PRIME))
}

/// `"Trait.method"`, the method's name in logs, spans and metrics.
pub(crate) fn qualified_name(service: &str, method: &str) -> String {
    format!("{service}.{method}")
}

/// `"Trait.method(arg:Type,..)->Output"`, the string a method id is the hash of: the qualified
/// name, then each argument's name and type and the output type, as the macro sees their tokens
/// (whitespace removed). The codec is positional, so a client and a server that disagree on any
/// of these would otherwise decode each other's bytes silently as something else; with them in
/// the id, the server answers `UnknownMethod` instead.
pub(crate) fn signature(service: &str, method: &MethodDef) -> String {
    let args: Vec<String> =
        method.args.iter().map(|arg| format!("{}:{}", arg.ident.unraw(), type_key(&arg.ty))).collect();
    format!("{}({})->{}", qualified_name(service, &method.name()), args.join(","), type_key(&method.output))
}

/// A type's tokens without whitespace: `Option < Vec < u8 > >` is `Option<Vec<u8>>`.
fn type_key(ty: &syn::Type) -> String {
    ty.to_token_stream().to_string().chars().filter(|c| !c.is_whitespace()).collect()
}

/// Name of the associated const that holds a method's id: the method name in upper case.
pub(crate) fn const_name(method: &str) -> String {
    method.to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_vectors() {
        // Reference values of 32-bit FNV-1a.
        assert_eq!(fnv1a_32(""), 0x811c_9dc5);
        assert_eq!(fnv1a_32("a"), 0xe40c_292c);
        assert_eq!(fnv1a_32("foobar"), 0xbf9c_f968);
    }

    #[test]
    fn known_colliding_pair_collides() {
        // The pair the `id_collision` UI test relies on.
        assert_eq!(fnv1a_32("Clash.m_hdtrw()->()"), fnv1a_32("Clash.m_vckxa()->()"));
    }

    #[test]
    fn ids_depend_on_service_and_method_names() {
        assert_ne!(fnv1a_32("Kv.get"), fnv1a_32("Kv.put"));
        assert_ne!(fnv1a_32("Kv.get"), fnv1a_32("Store.get"));
        assert_eq!(qualified_name("Kv", "get"), "Kv.get");
    }

    #[test]
    fn signatures_carry_argument_names_types_and_output() {
        let method = |sig: proc_macro2::TokenStream| {
            let item: syn::ItemTrait = syn::parse2(quote::quote!(trait Kv { #sig })).unwrap();
            let def = crate::model::ServiceDef::from_trait(item, &syn::parse_quote!(::rpc_core)).unwrap();
            signature("Kv", &def.methods[0])
        };
        let put = method(quote::quote!(
            async fn put(&self, key: String, value: Vec<u8>) -> u64;
        ));
        assert_eq!(put, "Kv.put(key:String,value:Vec<u8>)->u64");
        let swapped = method(quote::quote!(
            async fn put(&self, value: String, key: String) -> u64;
        ));
        let same_types = method(quote::quote!(
            async fn put(&self, key: String, value: String) -> u64;
        ));
        assert_ne!(fnv1a_32(&swapped), fnv1a_32(&same_types), "swapping two String arguments changes the id");
        let unit = method(quote::quote!(
            async fn ping(&self);
        ));
        assert_eq!(
            unit,
            method(quote::quote!(
                async fn ping(&self) -> ();
            ))
        );
        assert_eq!(unit, "Kv.ping()->()");
        let raw = method(quote::quote!(
            async fn r#type(&self, r#in: u8);
        ));
        assert_eq!(raw, "Kv.type(in:u8)->()");
    }

    #[test]
    fn const_name_is_upper_case() {
        assert_eq!(const_name("get_many"), "GET_MANY");
    }
}
