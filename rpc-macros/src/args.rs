//! Arguments of the attribute itself: `#[service]` or `#[service(crate = "path")]`.

use proc_macro2::TokenStream;
use syn::parse::Parser;
use syn::{LitStr, Path};

/// Parsed `#[service(..)]` arguments.
#[derive(Debug)]
pub(crate) struct ServiceArgs {
    /// Path through which the generated code reaches the rpc-core library (`::rpc_core` by default).
    pub(crate) krate: Path,
}

impl ServiceArgs {
    /// Parses the attribute's argument tokens (everything between the parentheses).
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Self> {
        let mut krate: Option<Path> = None;
        let parser = syn::meta::parser(|meta| {
            if meta.path.is_ident("crate") {
                if krate.is_some() {
                    return Err(meta.error("duplicate `crate` argument"));
                }
                let lit: LitStr = meta.value()?.parse()?;
                krate = Some(lit.parse_with(Path::parse_mod_style)?);
                Ok(())
            } else {
                Err(meta.error("unknown `service` argument; the only supported one is `crate = \"path\"`"))
            }
        });
        parser.parse2(tokens)?;
        Ok(ServiceArgs { krate: krate.unwrap_or_else(default_crate_path) })
    }

    /// The path used when the attribute names none: `::rpc_core`.
    pub(crate) fn default_krate() -> Path {
        default_crate_path()
    }
}

fn default_crate_path() -> Path {
    syn::parse_quote!(::rpc_core)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::{quote, ToTokens};

    fn krate_of(tokens: TokenStream) -> String {
        ServiceArgs::parse(tokens).unwrap().krate.to_token_stream().to_string()
    }

    #[test]
    fn empty_args_default_to_rpc_core() {
        assert_eq!(krate_of(quote!()), ":: rpc_core");
    }

    #[test]
    fn crate_arg_is_parsed_as_a_path() {
        assert_eq!(krate_of(quote!(crate = "::my_rpc")), ":: my_rpc");
        assert_eq!(krate_of(quote!(crate = "crate::reexport::rpc")), "crate :: reexport :: rpc");
    }

    #[test]
    fn unknown_argument_is_rejected() {
        let err = ServiceArgs::parse(quote!(foo)).unwrap_err();
        assert!(err.to_string().contains("unknown `service` argument"), "{err}");
    }

    #[test]
    fn duplicate_crate_argument_is_rejected() {
        let err = ServiceArgs::parse(quote!(crate = "a", crate = "b")).unwrap_err();
        assert!(err.to_string().contains("duplicate"), "{err}");
    }

    #[test]
    fn crate_value_must_be_a_path() {
        assert!(ServiceArgs::parse(quote!(crate = "not a path")).is_err());
        assert!(ServiceArgs::parse(quote!(crate = 5)).is_err());
    }
}
