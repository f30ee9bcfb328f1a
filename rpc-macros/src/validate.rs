//! Checks that reject what the expansion can't support, each with an error at the offending token.

use std::collections::HashMap;

use proc_macro2::Ident;
use syn::ext::IdentExt;
use syn::visit::{self, Visit};
use syn::{
    FnArg, ItemTrait, Lifetime, Pat, PatIdent, PatType, Path, PathArguments, Receiver, ReturnType, Signature,
    TraitItem, TraitItemFn, Type, TypeImplTrait, TypeInfer, TypePath, TypeReference,
};

use crate::errors::Errors;
use crate::method_id::{const_name, fnv1a_32, qualified_name, signature};
use crate::model::{ArgDef, MethodDef};

/// Client stub methods every service gets; a service method of the same name would clash.
const RESERVED_CLIENT_METHODS: &[&str] = &["new", "with_options", "client"];

/// Methods of the traits every generated client implements (derived `Clone` and `Debug`, and the
/// standard library's blanket impls for every sized `Clone` type), with the trait. A service
/// method of the same name would be an inherent method of the client, and inherent methods win
/// over trait methods in method calls and in paths (`KvClient::clone`), silently changing what
/// code that clones or formats a client does.
const CLIENT_TRAIT_METHODS: &[(&str, &str)] = &[
    ("clone", "Clone"),
    ("clone_from", "Clone"),
    ("fmt", "Debug"),
    ("to_owned", "ToOwned"),
    ("clone_into", "ToOwned"),
    ("borrow", "Borrow"),
    ("borrow_mut", "BorrowMut"),
    ("type_id", "Any"),
    ("from", "From"),
    ("into", "Into"),
    ("try_from", "TryFrom"),
    ("try_into", "TryInto"),
];

/// The trait itself: no `unsafe`, `auto`, generics or where clause.
pub(crate) fn trait_header(item: &ItemTrait, errors: &mut Errors) {
    if let Some(unsafety) = &item.unsafety {
        errors.at(unsafety, "`#[service]` traits can't be `unsafe`");
    }
    if let Some(auto_token) = &item.auto_token {
        errors.at(auto_token, "`#[service]` traits can't be `auto` traits");
    }
    if !item.generics.params.is_empty() {
        errors.at(&item.generics, "generic `#[service]` traits are not supported");
    }
    if let Some(where_clause) = &item.generics.where_clause {
        errors.at(where_clause, "where clauses on `#[service]` traits are not supported");
    }
}

/// Anything in the trait other than a method.
pub(crate) fn reject_non_method_item(item: &TraitItem, errors: &mut Errors) {
    let what = match item {
        TraitItem::Const(_) => "associated consts are",
        TraitItem::Type(_) => "associated types are",
        TraitItem::Macro(_) => "macro invocations are",
        _ => "this item is",
    };
    errors
        .at(item, format_args!("{what} not supported in a `#[service]` trait; it may only contain methods"));
}

/// Everything about a method except its typed arguments and output, which the model parses itself.
pub(crate) fn method_signature(method: &TraitItemFn, errors: &mut Errors) {
    if let Some(body) = &method.default {
        errors.at(body, "default method bodies are not supported in a `#[service]` trait");
    }
    for attr in &method.attrs {
        if attr.path().is_ident("cfg") || attr.path().is_ident("cfg_attr") {
            errors.at(attr, "`#[cfg]` on `#[service]` methods is not supported");
        }
    }
    signature_qualifiers(&method.sig, errors);
    if !method.sig.generics.params.is_empty() {
        errors.at(&method.sig.generics, "generic methods are not supported in a `#[service]` trait");
    }
    if let Some(where_clause) = &method.sig.generics.where_clause {
        errors.at(where_clause, "where clauses are not supported on `#[service]` methods");
    }
    if let Some(variadic) = &method.sig.variadic {
        errors.at(variadic, "variadic arguments are not supported");
    }
    receiver(&method.sig, errors);
}

/// `async` is required; `const`, `unsafe` and `extern` are rejected.
fn signature_qualifiers(sig: &Signature, errors: &mut Errors) {
    if let Some(constness) = &sig.constness {
        errors.at(constness, "`const fn` is not supported in a `#[service]` trait");
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.at(unsafety, "`unsafe fn` is not supported in a `#[service]` trait");
    }
    if let Some(abi) = &sig.abi {
        errors.at(abi, "`extern` functions are not supported in a `#[service]` trait");
    }
    if sig.asyncness.is_none() {
        errors.at(sig.fn_token, "`#[service]` methods must be `async fn`");
    }
}

/// The first argument must be exactly `&self`.
fn receiver(sig: &Signature, errors: &mut Errors) {
    match sig.inputs.first() {
        Some(FnArg::Receiver(receiver)) => receiver_form(receiver, errors),
        Some(typed @ FnArg::Typed(_)) => {
            errors.at(typed, "`#[service]` methods must take `&self` as their first argument")
        }
        None => errors.push(syn::Error::new(
            sig.paren_token.span.join(),
            "`#[service]` methods must take `&self` as their first argument",
        )),
    }
}

fn receiver_form(receiver: &Receiver, errors: &mut Errors) {
    if receiver.colon_token.is_some() {
        errors.at(receiver, "typed receivers are not supported; the receiver must be `&self`");
        return;
    }
    match &receiver.reference {
        None => errors.at(receiver, "by-value `self` is not supported; the receiver must be `&self`"),
        Some((_, Some(lifetime))) => {
            errors.at(lifetime, "lifetimes are not supported in `#[service]` methods; use `&self`")
        }
        Some((_, None)) => {
            if receiver.mutability.is_some() {
                errors.at(
                    receiver,
                    "`&mut self` is not supported: a service serves requests concurrently, so the receiver \
                     must be `&self` (use interior mutability)",
                );
            }
        }
    }
}

/// `Some` if `arg`'s type is the call context, `<krate>::Context` or `<krate>::context::Context`
/// as written (e.g. `rpc_core::Context`; a bare `Context` is an ordinary argument, since the macro
/// cannot tell it from a type of the user's); then `Ok` with its name if it is a plain identifier.
pub(crate) fn context_arg(arg: &FnArg, krate: &Path) -> Option<syn::Result<ArgDef>> {
    let FnArg::Typed(PatType { pat, ty, .. }) = arg else { return None };
    if !is_context_type(ty, krate) {
        return None;
    }
    Some(plain_ident(pat).map(|ident| ArgDef { ident, ty: (**ty).clone() }))
}

fn is_context_type(ty: &Type, krate: &Path) -> bool {
    let Type::Path(TypePath { qself: None, path }) = ty else { return false };
    let plain = |p: &Path| -> Option<Vec<String>> {
        p.segments
            .iter()
            .map(|s| matches!(s.arguments, PathArguments::None).then(|| s.ident.to_string()))
            .collect()
    };
    let (Some(mut names), Some(krate)) = (plain(path), plain(krate)) else { return false };
    if names.pop().as_deref() != Some("Context") {
        return false;
    }
    // `rpc_core::Context` and `::rpc_core::Context` alike (the leading `::` is not a segment).
    names == krate
        || (names.last().map(String::as_str) == Some("context") && names[..names.len() - 1] == krate[..])
}

/// An argument after the receiver: a plain identifier and an owned type.
pub(crate) fn typed_arg(arg: &FnArg) -> syn::Result<ArgDef> {
    let PatType { attrs, pat, ty, .. } = match arg {
        FnArg::Typed(typed) => typed,
        FnArg::Receiver(receiver) => {
            return Err(syn::Error::new_spanned(receiver, "`self` may only be the first argument"))
        }
    };
    let mut errors = Errors::default();
    if let Some(attr) = attrs.first() {
        errors.at(attr, "attributes on `#[service]` method arguments are not supported");
    }
    let ident = plain_ident(pat);
    if let Err(err) = &ident {
        errors.push(err.clone());
    }
    errors.take(owned_type(ty));
    errors.finish(())?;
    Ok(ArgDef { ident: ident?, ty: (**ty).clone() })
}

fn plain_ident(pat: &Pat) -> syn::Result<Ident> {
    match pat {
        Pat::Ident(PatIdent { attrs, by_ref: None, ident, subpat: None, .. }) if attrs.is_empty() => {
            Ok(ident.clone())
        }
        _ => Err(syn::Error::new_spanned(
            pat,
            "argument patterns are not supported in `#[service]` methods; use a plain identifier (`name: Type`)",
        )),
    }
}

/// The method's output type, `()` if there is no `->`.
pub(crate) fn output(output: &ReturnType, errors: &mut Errors) -> syn::Type {
    match output {
        ReturnType::Default => syn::parse_quote!(()),
        ReturnType::Type(_, ty) => {
            errors.take(owned_type(ty));
            (**ty).clone()
        }
    }
}

/// Arguments and results cross the wire, so they must be owned, concrete types: no references, no
/// lifetimes other than `'static`, no `impl Trait`, no `_`, no `Self`.
fn owned_type(ty: &Type) -> syn::Result<()> {
    let mut checker = OwnedTypeChecker::default();
    checker.visit_type(ty);
    checker.errors.finish(())
}

#[derive(Default)]
struct OwnedTypeChecker {
    errors: Errors,
}

impl<'ast> Visit<'ast> for OwnedTypeChecker {
    fn visit_type_reference(&mut self, reference: &'ast TypeReference) {
        self.errors.at(
            reference,
            "references are not supported in `#[service]` signatures: arguments and results cross the \
             network, so they must be owned types (e.g. `String`, `Vec<u8>`)",
        );
    }

    fn visit_lifetime(&mut self, lifetime: &'ast Lifetime) {
        if lifetime.ident != "static" {
            self.errors.at(
                lifetime,
                "lifetimes are not supported in `#[service]` signatures: arguments and results must be owned",
            );
        }
    }

    fn visit_type_impl_trait(&mut self, impl_trait: &'ast TypeImplTrait) {
        self.errors.at(
            impl_trait,
            "`impl Trait` is not supported in `#[service]` signatures; use a concrete type (and `async fn` \
             instead of returning `impl Future`)",
        );
    }

    fn visit_type_infer(&mut self, infer: &'ast TypeInfer) {
        self.errors.at(infer, "`_` is not allowed in `#[service]` signatures; write the type");
    }

    fn visit_type_path(&mut self, path: &'ast TypePath) {
        match path.path.segments.first() {
            Some(first) if path.qself.is_none() && first.ident == "Self" => self
                .errors
                .at(path, "`Self` is not supported in `#[service]` signatures; name the type explicitly"),
            _ => visit::visit_type_path(self, path),
        }
    }
}

/// Method names must not clash with the client stub's own items, and their ids must be unique.
pub(crate) fn method_names(service: &Ident, methods: &[MethodDef], errors: &mut Errors) {
    let service_name = service.unraw().to_string();
    let client = format!("{service_name}Client");
    let mut consts: HashMap<String, &Ident> = HashMap::new();
    let mut ids: HashMap<u32, &Ident> = HashMap::new();
    for method in methods {
        let name = method.name();
        let constant = const_name(&name);
        if RESERVED_CLIENT_METHODS.contains(&name.as_str()) {
            let msg =
                format!("method name `{name}` clashes with the generated `{client}::{name}`; rename it");
            errors.at(&method.ident, msg);
        } else if let Some((_, tr)) = CLIENT_TRAIT_METHODS.iter().find(|(m, _)| *m == name) {
            let msg = format!(
                "method name `{name}` would shadow `{tr}::{name}` on the generated `{client}`, which \
                 implements `{tr}`; rename it"
            );
            errors.at(&method.ident, msg);
        } else if constant == name {
            let msg = format!(
                "method `{name}` would clash with its id constant `{client}::{constant}`; \
                 use a snake_case method name"
            );
            errors.at(&method.ident, msg);
        } else if let Some(first) = consts.insert(constant.clone(), &method.ident) {
            let msg =
                format!("methods `{first}` and `{name}` would share the id constant `{client}::{constant}`");
            errors.at(&method.ident, msg);
        }
        let qualified = qualified_name(&service_name, &name);
        let id = fnv1a_32(&signature(&service_name, method));
        if let Some(first) = ids.insert(id, &method.ident) {
            let msg = format!(
                "the method id of `{qualified}` ({id:#010x}) collides with that of `{}`; rename one of them",
                qualified_name(&service_name, &first.unraw().to_string()),
            );
            errors.at(&method.ident, msg);
        }
    }
}
