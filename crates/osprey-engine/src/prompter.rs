//! What turns a request's text into the model's token ids: the tokenizer and the chat template,
//! read from the model file. The engine has one; a router that places requests by the blocks
//! workers hold loads one alone (no weights) to hash prompts the way the workers do.

use osprey_core::Error;
use osprey_models::{GgufFile, ModelError};

use crate::chat_template::{ChatTemplate, TemplateMessage};
use crate::tokenizer::Tokenizer;

/// A model's tokenizer and chat template.
pub struct Prompter {
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl Prompter {
    /// The tokenizer and chat template of `gguf` (ChatML when its template does not compile).
    /// A file without a template gets Gemma's turns or ChatML (see [`GEMMA_TURNS`]).
    ///
    /// [`GEMMA_TURNS`]: crate::chat_template::GEMMA_TURNS
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, ModelError> {
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        let token_text = |id: Option<u32>| {
            id.and_then(|i| tokenizer.id_to_token(i))
                .unwrap_or_default()
        };
        // A file without a template: Gemma's turns if its vocabulary ends turns Gemma's way,
        // else ChatML.
        let gemma_turns = (tokenizer.end_of_generation().iter())
            .any(|&id| tokenizer.id_to_token(id).as_deref() == Some("<end_of_turn>"));
        let source = (gguf.str("tokenizer.chat_template").ok())
            .or(gemma_turns.then_some(crate::chat_template::GEMMA_TURNS));
        let template = ChatTemplate::new(
            source,
            token_text(tokenizer.bos()),
            token_text(tokenizer.eos()),
        )
        .or_else(|e| {
            tracing::warn!(error = %e, "the model's chat template does not compile; using ChatML");
            ChatTemplate::new(None, String::new(), String::new())
        })
        .map_err(ModelError::Tokenizer)?;
        Ok(Self {
            tokenizer,
            template,
        })
    }

    /// Loads only the tokenizer and template of the model at `path` (a GGUF file or a
    /// checkpoint directory).
    pub fn load(path: &std::path::Path) -> Result<Self, ModelError> {
        Self::from_gguf(&GgufFile::open(
            &osprey_models::checkpoint::tokenizer_file(path),
        )?)
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Renders a conversation with the chat template, ready for the assistant's turn.
    pub fn render_chat(&self, messages: &[TemplateMessage]) -> Result<String, Error> {
        self.template.render(messages, true)
    }

    /// The token ids of a conversation, rendered and tokenized as the engine does.
    pub fn chat_tokens(&self, messages: &[TemplateMessage]) -> Result<Vec<u32>, Error> {
        Ok(self.tokenizer.encode(&self.render_chat(messages)?, true))
    }
}
