//! Speculative decoding: a load's `draft_model` is another catalogue model, checked against
//! the model it drafts for (llama.cpp's vocabulary rule, `registry::memory::draft_mismatch`);
//! its memory is counted with the model's, on the devices the model goes to.

use api_types::LoadOptions;
use backends::Recipe;
use registry::ModelInfo;

use crate::catalogue::Catalogue;
use crate::error::{EngineError, Result};

fn refused(message: String) -> EngineError {
    EngineError::invalid_code(message, "draft_model", "invalid_draft_model")
}

/// The draft `options` name for `info`, checked: a downloaded llama.cpp model whose
/// vocabulary matches; None when there is none. A 400 naming `draft_model` otherwise, with
/// both models named.
pub fn check(catalogue: &Catalogue, info: &ModelInfo, options: &LoadOptions) -> Result<Option<ModelInfo>> {
    let Some(name) = options.draft_model.as_deref().filter(|_| info.recipe == Recipe::LlamaCpp) else {
        return Ok(None);
    };
    let draft = catalogue.get(name).map_err(|_| {
        refused(format!("Invalid value for 'draft_model': there is no model '{name}' in the catalogue"))
    })?;
    if draft.recipe != Recipe::LlamaCpp {
        return Err(refused(format!(
            "Model '{}' cannot use '{name}' as its draft: a draft must be a llama.cpp (GGUF) model, and '{name}' is {}",
            info.name, draft.recipe
        )));
    }
    if !draft.downloaded {
        return Err(refused(format!(
            "The draft model '{name}' is not downloaded. Pull it first: lemonade pull {name}"
        )));
    }
    if let (Some(t), Some(d)) = (info.shape, draft.shape) {
        if let Some(why) = registry::memory::draft_mismatch(&t, &d) {
            return Err(refused(format!(
                "Model '{}' cannot use '{name}' as its draft: {why}. A draft must share the model's vocabulary",
                info.name
            )));
        }
    }
    Ok(Some(draft))
}
