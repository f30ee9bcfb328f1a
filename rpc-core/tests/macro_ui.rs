//! Compile-time tests of `#[service]`: `ui/pass` must expand, compile and run (their `main`s assert);
//! `ui/fail` must be rejected with exactly the error in the neighbouring `.stderr` file.
//!
//! After changing a message, regenerate with `TRYBUILD=overwrite cargo test -p rpc-core --test macro_ui`
//! and read the new `.stderr` files: each must point at the offending token.

#[test]
fn service_macro_ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
