//! Collects several `syn::Error`s so one expansion reports every problem at once.

use std::fmt::Display;

use quote::ToTokens;

/// An accumulator of span-accurate errors.
#[derive(Default)]
pub(crate) struct Errors {
    combined: Option<syn::Error>,
    count: usize,
}

impl Errors {
    /// Records `err`.
    pub(crate) fn push(&mut self, err: syn::Error) {
        self.count += 1;
        match &mut self.combined {
            Some(combined) => combined.combine(err),
            None => self.combined = Some(err),
        }
    }

    /// Records an error spanning `tokens`.
    pub(crate) fn at(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records the error of `result`, if any, and returns its value.
    pub(crate) fn take<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|err| self.push(err)).ok()
    }

    /// How many errors were recorded so far.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// `Ok(value)` if nothing was recorded, otherwise every recorded error.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.combined {
            Some(err) => Err(err),
            None => Ok(value),
        }
    }
}
