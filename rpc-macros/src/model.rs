//! The service as the generators see it: parsed from the user's trait, every signature already validated.

use proc_macro2::Ident;
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::{Attribute, ItemTrait, Path, Token, TraitItem, TraitItemFn, Type, TypeParamBound, Visibility};

use crate::args::MethodOptions;
use crate::errors::Errors;
use crate::validate;

/// A `#[service]` trait.
pub(crate) struct ServiceDef {
    /// Attributes of the trait, docs included.
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) ident: Ident,
    /// Supertraits the user wrote; the expansion adds `Send + Sync + 'static`.
    pub(crate) supertraits: Punctuated<TypeParamBound, Token![+]>,
    pub(crate) methods: Vec<MethodDef>,
}

/// One `async fn name(&self, arg: Ty, ..) -> Out;` of the trait.
pub(crate) struct MethodDef {
    /// Attributes of the method, docs included.
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) ident: Ident,
    /// `ctx: rpc_core::Context` as the first argument after `&self`: the handler gets its call's
    /// context there (it does not travel; the client stub has no such parameter).
    pub(crate) context: Option<ArgDef>,
    /// The arguments that travel.
    pub(crate) args: Vec<ArgDef>,
    /// The declared output; `()` when the signature has no `->`.
    pub(crate) output: Type,
    /// `#[rpc(inline)]`: its handler is polled first in the connection's driver.
    pub(crate) inline: bool,
}

/// One `name: Ty` argument (any `mut` dropped: it means nothing to callers).
pub(crate) struct ArgDef {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
}

impl ServiceDef {
    /// Parses and validates `item`, reporting every unsupported construct at its own span.
    pub(crate) fn from_trait(item: ItemTrait, krate: &Path) -> syn::Result<Self> {
        let mut errors = Errors::default();
        validate::trait_header(&item, &mut errors);
        let mut methods = Vec::new();
        for trait_item in item.items {
            match trait_item {
                TraitItem::Fn(method) => methods.extend(MethodDef::from_trait_fn(method, krate, &mut errors)),
                other => validate::reject_non_method_item(&other, &mut errors),
            }
        }
        validate::method_names(&item.ident, &methods, &mut errors);
        let service = ServiceDef {
            attrs: item.attrs,
            vis: item.vis,
            ident: item.ident,
            supertraits: item.supertraits,
            methods,
        };
        errors.finish(service)
    }

    /// The service name as sent in method ids and logs (`r#` prefix removed).
    pub(crate) fn name(&self) -> String {
        self.ident.unraw().to_string()
    }
}

impl MethodDef {
    /// Parses one trait method; `None` (with errors recorded) if its signature is unsupported.
    fn from_trait_fn(mut method: TraitItemFn, krate: &Path, errors: &mut Errors) -> Option<Self> {
        let before = errors.len();
        let options = MethodOptions::take(&mut method.attrs, errors);
        validate::method_signature(&method, errors);
        let inputs = method.sig.inputs.iter().skip(1);
        let mut args = Vec::new();
        let mut context = None;
        for (i, arg) in inputs.enumerate() {
            if let Some(ctx) = validate::context_arg(arg, krate) {
                if i == 0 {
                    context = errors.take(ctx);
                } else {
                    errors.at(arg, "the call context may only be the first argument after `&self`");
                }
                continue;
            }
            args.extend(errors.take(validate::typed_arg(arg)));
        }
        let output = validate::output(&method.sig.output, errors);
        (errors.len() == before).then(|| MethodDef {
            attrs: method.attrs,
            ident: method.sig.ident,
            context,
            args,
            output,
            inline: options.inline,
        })
    }

    /// The method name as hashed into its id (`r#` prefix removed).
    pub(crate) fn name(&self) -> String {
        self.ident.unraw().to_string()
    }

    /// Doc attributes only, to copy onto the client stub's method.
    pub(crate) fn doc_attrs(&self) -> impl Iterator<Item = &Attribute> {
        self.attrs.iter().filter(|attr| attr.path().is_ident("doc"))
    }
}
