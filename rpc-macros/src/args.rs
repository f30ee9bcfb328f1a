//! Arguments of the attribute itself, `#[service]` or `#[service(crate = "path")]`, and of the
//! `#[rpc(..)]` attribute on a method of the trait.

use proc_macro2::TokenStream;
use syn::parse::Parser;
use syn::{Attribute, LitStr, Path};

use crate::errors::Errors;

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

/// Options of one method, from its `#[rpc(..)]` attributes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct MethodOptions {
    /// `#[rpc(inline)]`: the server polls its handler first in the connection's driver
    /// (`MethodDesc::inline`).
    pub(crate) inline: bool,
}

impl MethodOptions {
    /// Takes the `#[rpc(..)]` attributes out of `attrs` (they are the macro's own: the trait as
    /// emitted does not carry them) and parses them, each problem an error at its token.
    pub(crate) fn take(attrs: &mut Vec<Attribute>, errors: &mut Errors) -> Self {
        let mut options = MethodOptions::default();
        attrs.retain(|attr| {
            if !attr.path().is_ident("rpc") {
                return true;
            }
            let parsed = attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("inline") {
                    if options.inline {
                        return Err(meta.error("duplicate `inline` option"));
                    }
                    options.inline = true;
                    Ok(())
                } else {
                    Err(meta.error("unknown `rpc` option; the only supported one is `inline`"))
                }
            });
            errors.take(parsed);
            false
        });
        options
    }
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

    fn options_of(attrs: Vec<Attribute>) -> (Result<MethodOptions, String>, Vec<Attribute>) {
        let (mut attrs, mut errors) = (attrs, Errors::default());
        let options = MethodOptions::take(&mut attrs, &mut errors);
        (errors.finish(options).map_err(|e| e.to_string()), attrs)
    }

    #[test]
    fn rpc_inline_is_taken_out_of_the_method_attributes() {
        let (options, left) = options_of(vec![
            syn::parse_quote!(#[doc = " Looks a key up."]),
            syn::parse_quote!(#[rpc(inline)]),
        ]);
        assert_eq!(options, Ok(MethodOptions { inline: true }));
        assert_eq!(left.len(), 1);
        assert!(left[0].path().is_ident("doc"));
        let (options, left) = options_of(vec![syn::parse_quote!(#[doc = " Plain."])]);
        assert_eq!(options, Ok(MethodOptions { inline: false }));
        assert_eq!(left.len(), 1);
    }

    #[test]
    fn unknown_duplicate_and_malformed_rpc_options_are_rejected() {
        let (options, left) = options_of(vec![syn::parse_quote!(#[rpc(fast)])]);
        assert!(options.unwrap_err().contains("unknown `rpc` option"));
        assert!(left.is_empty());
        let (options, _) = options_of(vec![syn::parse_quote!(#[rpc(inline, inline)])]);
        assert!(options.unwrap_err().contains("duplicate `inline`"));
        let (options, _) =
            options_of(vec![syn::parse_quote!(#[rpc(inline)]), syn::parse_quote!(#[rpc(inline)])]);
        assert!(options.unwrap_err().contains("duplicate `inline`"));
        let (options, _) = options_of(vec![syn::parse_quote!(#[rpc = "inline"])]);
        assert!(options.is_err(), "`#[rpc = ..]` is not a list");
    }

    #[test]
    fn crate_value_must_be_a_path() {
        assert!(ServiceArgs::parse(quote!(crate = "not a path")).is_err());
        assert!(ServiceArgs::parse(quote!(crate = 5)).is_err());
    }
}
