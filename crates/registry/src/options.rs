//! The one precedence chain of load options, lowest first:
//!
//! 1. the recipe's defaults (`backends::options::defaults`);
//! 2. the server's configuration (flags, `LEMONADE_*` variables);
//! 3. the catalogue's `image_defaults` of an image model (as v9);
//! 4. the model's saved options (`recipe_options.json`);
//! 5. the request: a value overrides, `null` ignores the saved value (layer 4) for this load.
//!
//! [`resolve`] layers 2 to 5 (what a backend is started with; a default is read where it is
//! used); [`load_body`] adds layer 1 and makes a complete `/load` body of the result.

use api_types::{LoadOptions, OptionKey, OptionsPatch};
use backends::Recipe;
use serde_json::{Map, Value};

/// The layers above the recipe's defaults.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    pub config: &'a LoadOptions,
    pub catalogue: &'a LoadOptions,
    pub saved: &'a LoadOptions,
    pub request: &'a OptionsPatch,
}

/// The options `recipe` runs with: request > saved > catalogue > configuration, only the
/// recipe's own options kept. The `*_args` are merged as Lemonade v11 merges them unless
/// `merge_args` is `false`: the model's own (the request's replacing the saved ones) over the
/// catalogue's over the configuration's, a higher layer's flag winning
/// ([`backends::options::merge_args`]).
pub fn resolve(recipe: Recipe, l: Layers) -> LoadOptions {
    let mut model = l.saved.clone().clear(&l.request.cleared);
    model.overlay(&l.request.set);
    let mut o = l.config.clone();
    o.overlay(l.catalogue);
    o.overlay(&model);
    if o.merge_args != Some(false) {
        let merged = |f: fn(&LoadOptions) -> &Option<String>| {
            [&model, l.catalogue, l.config].into_iter().filter_map(|x| f(x).as_deref()).try_fold(
                None::<String>,
                |acc, lower| match acc {
                    None => Ok(Some(lower.to_string())),
                    Some(higher) => backends::options::merge_args(&higher, lower).map(Some),
                },
            )
        };
        if let Ok(a) = merged(|x| &x.llamacpp_args) {
            o.llamacpp_args = a;
        }
        if let Ok(a) = merged(|x| &x.whispercpp_args) {
            o.whispercpp_args = a;
        }
    }
    // Canonical: a value spelled out at its default is the default left unset, so that a load
    // replaying `effective` (every option written out) is the same load. The backends stay: the
    // one a load gets when none is named depends on the machine, not on the recipe alone.
    let backends = [OptionKey::LlamacppBackend, OptionKey::WhispercppBackend, OptionKey::SdcppBackend];
    crate::recipe_options(recipe, o).without_defaults(&backends::options::defaults(recipe), &backends)
}

/// A complete `/load` body for `name`: every option `recipe` takes, resolved over its
/// defaults, then `idle_timeout` (seconds; 0 = never) and `model_name`.
pub fn load_body(name: &str, recipe: Recipe, resolved: &LoadOptions, idle_timeout: u64) -> Map<String, Value> {
    let mut o = backends::options::defaults(recipe);
    o.overlay(resolved);
    let o = LoadOptions { idle_timeout: Some(idle_timeout), ..o.keep(recipe.option_keys()) };
    let mut body = o.to_map();
    body.insert("model_name".into(), name.into());
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::CtxSize;
    use serde_json::json;

    fn ctx(n: u32) -> LoadOptions {
        LoadOptions { ctx_size: Some(CtxSize::Tokens(n)), ..Default::default() }
    }

    /// Why, configuration, catalogue, saved, request, and the context size a load gets.
    type Row<'a> = (&'a str, &'a LoadOptions, &'a LoadOptions, &'a LoadOptions, OptionsPatch, Option<CtxSize>);

    /// The precedence table: each row's layers, and the context size a load gets.
    #[test]
    fn precedence_table() {
        let none = LoadOptions::default();
        let set = |o: LoadOptions| OptionsPatch { set: o, ..Default::default() };
        let null = OptionsPatch { cleared: vec![OptionKey::CtxSize], ..Default::default() };
        let auto = LoadOptions { ctx_size: Some(CtxSize::Auto), ..Default::default() };
        #[rustfmt::skip]
        let rows: [Row; 8] = [
            ("nothing set: the recipe default applies when read", &none, &none, &none, OptionsPatch::default(), None),
            ("configuration",                                     &ctx(1000), &none, &none, OptionsPatch::default(), Some(CtxSize::Tokens(1000))),
            ("catalogue over configuration",                      &ctx(1000), &ctx(2000), &none, OptionsPatch::default(), Some(CtxSize::Tokens(2000))),
            ("saved over catalogue and configuration",            &ctx(1000), &ctx(2000), &ctx(3000), OptionsPatch::default(), Some(CtxSize::Tokens(3000))),
            ("request over everything",                           &ctx(1000), &ctx(2000), &ctx(3000), set(ctx(4000)), Some(CtxSize::Tokens(4000))),
            ("null ignores the saved value only",                 &ctx(1000), &none, &ctx(3000), null.clone(), Some(CtxSize::Tokens(1000))),
            ("null with nothing below: the default",              &none, &none, &ctx(3000), null, None),
            ("-1 is a value: automatic over a saved number",      &ctx(1000), &none, &ctx(3000), set(auto), Some(CtxSize::Auto)),
        ];
        for (why, config, catalogue, saved, request, want) in rows {
            let got = resolve(Recipe::LlamaCpp, Layers { config, catalogue, saved, request: &request });
            assert_eq!(got.ctx_size, want, "{why}");
        }
    }

    #[test]
    fn request_args_replace_the_saved_args_merge_with_the_servers_and_other_recipes_options_drop() {
        let args = |a: &str| LoadOptions { llamacpp_args: Some(a.into()), ..Default::default() };
        let saved = LoadOptions { steps: Some(4), ..args("--no-mmap -np 2") };
        let config = args("-t 2 --mmap -fa on");
        let request = OptionsPatch { set: args("-t 1"), ..Default::default() };
        let none = LoadOptions::default();
        let run = |saved: &LoadOptions, request: &OptionsPatch| {
            resolve(Recipe::LlamaCpp, Layers { config: &config, catalogue: &none, saved, request })
        };
        let o = run(&saved, &request);
        assert_eq!(
            (o.llamacpp_args.as_deref(), o.steps),
            (Some("-t 1 --mmap -fa on"), None),
            "the request's args replace the saved ones and merge with the server's"
        );
        let o = run(&saved, &OptionsPatch::default());
        assert_eq!(o.llamacpp_args.as_deref(), Some("--no-mmap -np 2 -t 2 -fa on"), "--no-mmap beats --mmap");
        let off = OptionsPatch { set: LoadOptions { merge_args: Some(false), ..args("-t 1") }, ..Default::default() };
        assert_eq!(run(&saved, &off).llamacpp_args.as_deref(), Some("-t 1"), "merge_args: false replaces");
        let empty = OptionsPatch { set: args(""), ..Default::default() };
        assert_eq!(
            run(&saved, &empty).llamacpp_args.as_deref(),
            Some("-t 2 --mmap -fa on"),
            "an empty layer adds nothing"
        );
    }

    #[test]
    fn a_load_body_has_every_option_of_the_recipe() {
        let b = load_body("M", Recipe::LlamaCpp, &ctx(2048), 0);
        assert_eq!(
            Value::Object(b),
            json!({"model_name": "M", "ctx_size": 2048, "device": "auto", "llamacpp_backend": "cpu", "llamacpp_args": "",
                   "rpc_servers": [], "merge_args": true, "idle_timeout": 0})
        );
        let sd = load_body("S", Recipe::SdCpp, &LoadOptions::default(), 300);
        assert_eq!(sd["steps"], 20);
        assert_eq!(sd["width"], 512);
        assert_eq!(sd["idle_timeout"], 300);
    }
}
