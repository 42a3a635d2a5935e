//! Chat templates: the model's own Jinja template (from GGUF metadata) rendered with minijinja.
//!
//! Hugging Face templates are written for Python's Jinja, so Python string methods
//! (`.strip()`, `.startswith()`…) come from minijinja-contrib's pycompat layer, and the
//! helpers templates expect (`raise_exception`, `strftime_now`) are provided.

use minijinja::{Environment, ErrorKind, Value, context};
use osprey_core::Error;
use serde::Serialize;

/// ChatML, for models whose file carries no template.
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turns, for a Gemma file that carries no template (a base model): a system message
/// opens the first user turn, as Gemma's own template does, and the assistant is `model`. BOS
/// comes from the tokenizer.
pub const GEMMA_TURNS: &str = "{% set ns = namespace(system='') %}{% for message in messages %}{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\n\n' %}{% else %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' + ns.system + message['content'] | trim + '<end_of_turn>\n' }}{% set ns.system = '' %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// A message as templates see it: role and plain-text content.
#[derive(Clone, Debug, Serialize)]
pub struct TemplateMessage {
    /// The speaker.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` (or ChatML when `None`); `bos_token`/`eos_token` are the texts the
    /// template may reference.
    pub fn new(source: Option<&str>, bos_token: String, eos_token: String) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Hugging Face renders templates with both options on.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| -> String {
            format_utc_now(&fmt)
        });
        env.add_template_owned("chat", source.unwrap_or(CHATML).to_owned())
            .map_err(|e| format!("invalid chat template: {e}"))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders the conversation, ending with the assistant's turn opener when
    /// `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::internal(e.to_string()))?;
        tmpl.render(context! {
            messages => Value::from(minijinja::value::Serde(messages)),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| {
            // `raise_exception` is how templates reject a conversation (e.g. roles out of order).
            let detail = e.detail().unwrap_or("").to_owned();
            Error::invalid(
                "messages",
                format!(
                    "the model's chat template rejected the conversation: {detail}{}",
                    if detail.is_empty() {
                        e.to_string()
                    } else {
                        String::new()
                    }
                ),
            )
        })
    }
}

/// `strftime_now` for templates that print today's date (`%d %b %Y` and friends).
fn format_utc_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(month - 1) as usize];
    fmt.replace("%Y", &year.to_string())
        .replace("%m", &format!("{month:02}"))
        .replace("%d", &format!("{day:02}"))
        .replace("%B", name)
        .replace("%b", &name[..3])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> TemplateMessage {
        TemplateMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn chatml_fallback_renders_turns() {
        let t = ChatTemplate::new(None, String::new(), String::new()).unwrap();
        let out = t.render(&[msg("user", "hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_turns_fold_the_system_message_into_the_first_user_turn() {
        let t = ChatTemplate::new(Some(GEMMA_TURNS), String::new(), String::new()).unwrap();
        let out = t
            .render(
                &[
                    msg("system", "Be brief."),
                    msg("user", " Hi "),
                    msg("assistant", "Hello."),
                    msg("user", "Bye"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ messages[0]['content'].strip().upper() }}";
        let t = ChatTemplate::new(Some(src), String::new(), String::new()).unwrap();
        assert_eq!(t.render(&[msg("user", "  hi ")], false).unwrap(), "HI");
        let err = t.render(&[msg("system", "x")], false).unwrap_err();
        assert!(
            err.message.contains("first must be user"),
            "{}",
            err.message
        );
    }

    #[test]
    fn strftime_now_formats_a_date() {
        let s = format_utc_now("%d %b %Y");
        assert_eq!(s.len(), 11, "{s}");
    }
}
