//! Method ids as the runtime computes them, so collisions are reported at the offending method.

/// FNV-1a, 32 bits, of `qualified_name` (`"Trait.method"`).
///
/// Must stay identical to `rpc_core::__private::method_id`; the expansion also asks rpc-core to
/// re-check uniqueness at compile time (`assert_unique_ids`), so a divergence can't go unnoticed.
pub(crate) fn fnv1a_32(qualified_name: &str) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    qualified_name.bytes().fold(OFFSET_BASIS, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(PRIME))
}

/// `"Trait.method"`, the string a method id is the hash of.
pub(crate) fn qualified_name(service: &str, method: &str) -> String {
    format!("{service}.{method}")
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
        assert_eq!(fnv1a_32("Clash.write_qqrd"), fnv1a_32("Clash.fetch_qpfhai"));
    }

    #[test]
    fn ids_depend_on_service_and_method_names() {
        assert_ne!(fnv1a_32("Kv.get"), fnv1a_32("Kv.put"));
        assert_ne!(fnv1a_32("Kv.get"), fnv1a_32("Store.get"));
        assert_eq!(qualified_name("Kv", "get"), "Kv.get");
    }

    #[test]
    fn const_name_is_upper_case() {
        assert_eq!(const_name("get_many"), "GET_MANY");
    }
}
