//! Tool calls as the model sees them: the tools described in the prompt, earlier calls
//! written back into the conversation, the grammar a call is generated under, and the
//! model's text parsed back into calls (whole, or as it streams).
//!
//! The format is the `<tool_call>` JSON one that Hermes and Qwen models are trained on, told
//! to models whose chat template knows no tools through the system message:
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! Under the grammar a call's arguments always match its function's JSON schema; with
//! `tool_choice: auto` the model may instead answer in text (which then may not begin with a
//! call's opening tag).

use osprey_core::api::{ChatMessage, Tool, ToolMode};
use osprey_core::{Error, Grammar};
use serde_json::Value;

use crate::chat_template::TemplateMessage;
use crate::structured::{json_object_rules, with_json_options};

/// Opens a call in the model's output.
pub const CALL_OPEN: &str = "<tool_call>";
/// Closes a call.
pub const CALL_CLOSE: &str = "</tool_call>";

/// The conversation as the chat template sees it: the tools (unless `mode` is `None`)
/// described at the end of the system message, assistant calls written as the model writes
/// them, and `tool` messages as they are.
pub fn template_messages(
    messages: &[ChatMessage],
    tools: &[Tool],
    mode: &ToolMode,
) -> Result<Vec<TemplateMessage>, Error> {
    let mut out = messages
        .iter()
        .map(|m| {
            let mut content = m.text()?;
            for call in m.tool_calls.iter().flatten() {
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&call_text(&call.function.name, &call.function.arguments));
            }
            Ok(TemplateMessage {
                role: m.role.clone(),
                content,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if tools.is_empty() || *mode == ToolMode::None {
        return Ok(out);
    }
    let preamble = tools_preamble(tools);
    match out.first_mut() {
        Some(first) if first.role == "system" || first.role == "developer" => {
            first.content = format!("{}\n\n{preamble}", first.content);
        }
        _ => out.insert(
            0,
            TemplateMessage {
                role: "system".into(),
                content: preamble,
            },
        ),
    }
    Ok(out)
}

/// A call as the model writes it.
fn call_text(name: &str, arguments: &str) -> String {
    // Arguments are re-serialised compactly when they parse, as the grammar writes them.
    let arguments = serde_json::from_str::<Value>(arguments)
        .map(|v| compact(&v))
        .unwrap_or_else(|_| arguments.to_owned());
    format!("{CALL_OPEN}\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n{CALL_CLOSE}")
}

/// JSON with `", "` and `": "` separators, as the grammar writes it.
fn compact(v: &Value) -> String {
    match v {
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), compact(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(compact).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

fn tools_preamble(tools: &[Tool]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to help with the user's request. \
         The functions are described in JSON within <tools></tools> tags:\n<tools>\n",
    );
    for tool in tools {
        let f = &tool.function;
        let desc = serde_json::json!({
            "name": f.name,
            "description": f.description.clone().unwrap_or_default(),
            "parameters": f.parameters(),
        });
        s.push_str(&compact(&desc));
        s.push('\n');
    }
    s.push_str(
        "</tools>\n\nTo call a function, answer with its name and arguments as a JSON object \
         within <tool_call></tool_call> tags:\n<tool_call>\n\
         {\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>",
    );
    s
}

/// The grammar of an answer under `mode`: one call or several (`parallel`), each of a
/// function in `tools` with arguments valid under its schema, or (with `auto`) text, itself
/// following `text` when given (`response_format` or Osprey's grammar). `None` when nothing
/// constrains the answer.
pub fn answer_grammar(
    tools: &[Tool],
    mode: &ToolMode,
    parallel: bool,
    text: Option<&Grammar>,
) -> Result<Option<Grammar>, Error> {
    let offered: Vec<&Tool> = match mode {
        ToolMode::None => return Ok(text.cloned()),
        ToolMode::Named(name) => tools.iter().filter(|t| &t.function.name == name).collect(),
        ToolMode::Auto | ToolMode::Required => tools.iter().collect(),
    };
    let mut lark = String::from("%llguidance {}\n");
    let calls = if parallel {
        "calls: call (\"\\n\" call)*\n"
    } else {
        "calls: call\n"
    };
    match mode {
        ToolMode::Auto => {
            lark.push_str("start: calls | answer\n");
            lark.push_str(&answer_rule(text)?);
        }
        _ => lark.push_str("start: calls\n"),
    }
    lark.push_str(calls);
    let names: Vec<String> = (0..offered.len()).map(|i| format!("call_{i}")).collect();
    lark.push_str(&format!("call: {}\n", names.join(" | ")));
    for (i, tool) in offered.iter().enumerate() {
        let f = &tool.function;
        let head = format!("{CALL_OPEN}\n{{\"name\": \"{}\", \"arguments\": ", f.name);
        let tail = format!("}}\n{CALL_CLOSE}");
        let schema = with_json_options(&f.parameters(), f.strict.unwrap_or(false));
        lark.push_str(&format!(
            "call_{i}: {} args_{i} {}\nargs_{i}: %json {}\n",
            Value::String(head),
            Value::String(tail),
            schema
        ));
    }
    Ok(Some(Grammar::Lark(lark)))
}

/// The rule for a text answer beside calls: free text that does not open with a call, or
/// the text's own grammar.
fn answer_rule(text: Option<&Grammar>) -> Result<String, Error> {
    Ok(match text {
        None => {
            "answer: ANSWER\nANSWER: /(?s:.+)/ & ~/(?s:[ \\t\\r\\n]*<tool_call>.*)/\n".to_owned()
        }
        Some(Grammar::JsonSchema { schema, strict }) => {
            format!("answer: %json {}\n", with_json_options(schema, *strict))
        }
        Some(Grammar::JsonObject) => format!("answer: j_object0\n{}", json_object_rules("j_")),
        Some(Grammar::Regex(rx)) => format!("answer: /{}/\n", rx.replace('/', "\\/")),
        Some(Grammar::Lark(_)) => {
            return Err(Error::invalid(
                "osprey.grammar",
                "a Lark grammar cannot be combined with tools; use response_format or a regex",
            ));
        }
    })
}

/// What the model's text turned out to be, piece by piece.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolEvent {
    /// Text of the answer.
    Content(String),
    /// A call began: its place in the answer and the function's name.
    CallStart {
        /// Which call of the answer (from 0).
        index: usize,
        /// The function.
        name: String,
    },
    /// More of a call's arguments (JSON text).
    Arguments {
        /// Which call.
        index: usize,
        /// The text.
        text: String,
    },
}

/// Splits a model's output, as it streams, into answer text and calls.
///
/// Only an answer that begins (after white space) with [`CALL_OPEN`] is calls; until that is
/// decided the text is held back. A call's name is known once `"arguments": ` follows it, and
/// its arguments stream from there up to the end of their JSON value.
#[derive(Debug, Default)]
pub struct ToolCallParser {
    state: State,
    buf: String,
    calls: usize,
}

#[derive(Debug, Default)]
enum State {
    /// Nothing decided yet.
    #[default]
    Start,
    /// Plain text: everything is content.
    Text,
    /// Between calls: expecting [`CALL_OPEN`] (or the end).
    BetweenCalls,
    /// Inside a call, before its arguments.
    CallHead,
    /// Inside the arguments' JSON value.
    Arguments(JsonScan),
    /// After the arguments: the object's `}` and [`CALL_CLOSE`].
    CallTail,
}

/// Where a scan through a JSON value is.
#[derive(Clone, Copy, Debug, Default)]
struct JsonScan {
    depth: usize,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl JsonScan {
    /// Feeds one character; true once the value is complete.
    fn push(&mut self, c: char) -> bool {
        if self.in_string {
            match (self.escaped, c) {
                (true, _) => self.escaped = false,
                (false, '\\') => self.escaped = true,
                (false, '"') => self.in_string = false,
                _ => {}
            }
            return false;
        }
        match c {
            '"' => {
                self.started = true;
                self.in_string = true;
            }
            '{' | '[' => {
                self.started = true;
                self.depth += 1;
            }
            '}' | ']' => self.depth = self.depth.saturating_sub(1),
            c if c.is_whitespace() => return false,
            _ => self.started = true,
        }
        self.started && self.depth == 0 && !self.in_string
    }
}

impl ToolCallParser {
    /// Feeds more of the output.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut events = Vec::new();
        self.advance(&mut events);
        events
    }

    /// The end of the output: what was held back.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut events = Vec::new();
        self.advance(&mut events);
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start | State::Text if !rest.is_empty() => events.push(ToolEvent::Content(rest)),
            // An unfinished call (the output was cut short): what there is of it, if its
            // name is whole (a call of no function, or of part of a name, would mislead).
            State::CallHead => {
                if let Some(name) = whole_name(&rest) {
                    events.push(ToolEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                }
            }
            State::Arguments(_) if !rest.trim().is_empty() => {
                events.push(ToolEvent::Arguments {
                    index: self.calls - 1,
                    text: rest,
                });
            }
            _ => {}
        }
        events
    }

    /// Calls found so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn advance(&mut self, events: &mut Vec<ToolEvent>) {
        loop {
            match &mut self.state {
                State::Start => {
                    let trimmed = self.buf.trim_start();
                    if trimmed.starts_with(CALL_OPEN) {
                        self.state = State::BetweenCalls;
                    } else if CALL_OPEN.starts_with(trimmed) {
                        return; // could still open a call
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Text => {
                    if !self.buf.is_empty() {
                        events.push(ToolEvent::Content(std::mem::take(&mut self.buf)));
                    }
                    return;
                }
                State::BetweenCalls => {
                    let trimmed = self.buf.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(CALL_OPEN) {
                        self.buf = rest.to_owned();
                        self.state = State::CallHead;
                    } else {
                        return;
                    }
                }
                State::CallHead => {
                    let Some((name, consumed)) = call_head(&self.buf) else {
                        return;
                    };
                    events.push(ToolEvent::CallStart {
                        index: self.calls,
                        name,
                    });
                    self.calls += 1;
                    self.buf.drain(..consumed);
                    self.state = State::Arguments(JsonScan::default());
                }
                State::Arguments(scan) => {
                    let mut end = None;
                    for (i, c) in self.buf.char_indices() {
                        if scan.push(c) {
                            end = Some(i + c.len_utf8());
                            break;
                        }
                    }
                    let index = self.calls - 1;
                    let upto = end.unwrap_or(self.buf.len());
                    let text: String = self.buf.drain(..upto).collect();
                    if !text.is_empty() {
                        events.push(ToolEvent::Arguments { index, text });
                    }
                    match end {
                        Some(_) => self.state = State::CallTail,
                        None => return,
                    }
                }
                State::CallTail => {
                    let Some(close) = self.buf.find(CALL_CLOSE) else {
                        return;
                    };
                    self.buf.drain(..close + CALL_CLOSE.len());
                    self.state = State::BetweenCalls;
                }
            }
        }
    }
}

/// The name of a call's head cut short (`{"name": "NAME"…`), if it is whole and not empty.
fn whole_name(head: &str) -> Option<String> {
    let mut parts = head.split('"');
    let name = parts.nth(3)?;
    parts.next()?; // its closing quote
    (!name.is_empty()).then(|| name.to_owned())
}

/// `{"name": "NAME", "arguments": ` at the start of `s`: the name and the bytes it takes.
fn call_head(s: &str) -> Option<(String, usize)> {
    let rest = s.trim_start();
    let mut at = s.len() - rest.len();
    let rest = rest.strip_prefix('{')?;
    at += 1;
    let after = rest.trim_start();
    at += rest.len() - after.len();
    let after = after.strip_prefix("\"name\"")?;
    at += "\"name\"".len();
    let colon = after.trim_start().strip_prefix(':')?;
    at += after.len() - colon.len();
    let value = colon.trim_start();
    at += colon.len() - value.len();
    let value = value.strip_prefix('"')?;
    let end = value.find('"')?;
    let name = value[..end].to_owned();
    at += 1 + end + 1;
    let tail = &s[at..];
    let comma = tail.trim_start().strip_prefix(',')?;
    let key = comma.trim_start().strip_prefix("\"arguments\"")?;
    let colon = key.trim_start().strip_prefix(':')?;
    let value = colon.trim_start();
    // The value must have begun, so that a space after the colon is not mistaken for it.
    if value.is_empty() {
        return None;
    }
    Some((name, s.len() - value.len()))
}

/// The calls and text of a whole output.
pub fn parse_output(text: &str) -> (String, Vec<(String, String)>) {
    let mut parser = ToolCallParser::default();
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(t) => content.push_str(&t),
            ToolEvent::CallStart { name, .. } => calls.push((name, String::new())),
            ToolEvent::Arguments { index, text } => {
                if let Some(call) = calls.get_mut(index) {
                    call.1.push_str(&text);
                }
            }
        }
    }
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        serde_json::from_value(serde_json::json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "add"}}
        ]))
        .unwrap()
    }

    #[test]
    fn calls_stream_out_piece_by_piece() {
        let out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>";
        // Every split of the output gives the same calls.
        for step in [1, 2, 3, 7, out.len()] {
            let mut p = ToolCallParser::default();
            let mut events = Vec::new();
            let chars: Vec<char> = out.chars().collect();
            for chunk in chars.chunks(step) {
                events.extend(p.push(&chunk.iter().collect::<String>()));
            }
            events.extend(p.finish());
            let starts: Vec<_> = events
                .iter()
                .filter_map(|e| match e {
                    ToolEvent::CallStart { index, name } => Some((*index, name.clone())),
                    _ => None,
                })
                .collect();
            assert_eq!(
                starts,
                vec![(0, "get_weather".into()), (1, "add".into())],
                "step {step}"
            );
            let args0: String = events
                .iter()
                .filter_map(|e| match e {
                    ToolEvent::Arguments { index: 0, text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(args0, "{\"city\": \"Paris \\\"}\"}", "step {step}");
            assert!(!events.iter().any(|e| matches!(e, ToolEvent::Content(_))));
        }
    }

    #[test]
    fn a_call_cut_short_keeps_what_it_has_but_never_a_partial_name() {
        let calls = |out: &str| parse_output(out).1;
        let head = "<tool_call>\n{\"name\": \"get_weather\"";
        assert_eq!(calls(head), vec![("get_weather".into(), String::new())]);
        let args = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1";
        assert_eq!(calls(args), vec![("add".into(), "{\"a\": 1".into())]);
        for cut in [
            "<tool_call>\n{\"na",
            "<tool_call>\n{\"name\": \"get_wea",
            "<tool_call>\n{\"name\": \"\"",
        ] {
            assert_eq!(calls(cut), vec![], "{cut}");
        }
        // A whole call, then one cut short before its name: only the whole one.
        let two =
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"";
        assert_eq!(calls(two), vec![("add".into(), "{}".into())]);
    }

    #[test]
    fn text_is_content_and_held_back_only_while_it_could_open_a_call() {
        let mut p = ToolCallParser::default();
        assert_eq!(p.push(" <tool"), vec![]);
        assert_eq!(
            p.push("s are"),
            vec![ToolEvent::Content(" <tools are".into())]
        );
        assert_eq!(p.push(" fun"), vec![ToolEvent::Content(" fun".into())]);
        let (content, calls) = parse_output("Paris is sunny.");
        assert_eq!((content.as_str(), calls.len()), ("Paris is sunny.", 0));
        let mut p = ToolCallParser::default();
        assert_eq!(p.push("<"), vec![]);
        assert_eq!(p.finish(), vec![ToolEvent::Content("<".into())]);
    }

    #[test]
    fn earlier_calls_are_written_back_as_the_model_writes_them() {
        let messages: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"}
        ]))
        .unwrap();
        let out = template_messages(&messages, &tools(), &ToolMode::Auto).unwrap();
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains("<tools>") && out[0].content.contains("get_weather"));
        assert_eq!(
            out[2].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        let (_, calls) = parse_output(&out[2].content);
        assert_eq!(
            calls,
            vec![("get_weather".into(), "{\"city\": \"Paris\"}".into())]
        );
        assert_eq!(
            (out[3].role.as_str(), out[3].content.as_str()),
            ("tool", "18C")
        );
        let none = template_messages(&messages, &tools(), &ToolMode::None).unwrap();
        assert_eq!(none.len(), 3, "no tools described for tool_choice none");
    }

    #[test]
    fn grammar_names_each_offered_function() {
        let Some(Grammar::Lark(g)) =
            answer_grammar(&tools(), &ToolMode::Named("add".into()), true, None).unwrap()
        else {
            panic!("a Lark grammar")
        };
        assert!(
            g.contains("\\\"add\\\"") && !g.contains("get_weather"),
            "{g}"
        );
        assert!(!g.contains("answer"), "required calls: no text branch");
        let Some(Grammar::Lark(g)) =
            answer_grammar(&tools(), &ToolMode::Auto, false, None).unwrap()
        else {
            panic!("a Lark grammar")
        };
        assert!(
            g.contains("start: calls | answer") && g.contains("calls: call\n"),
            "{g}"
        );
        assert_eq!(
            answer_grammar(&tools(), &ToolMode::None, true, None).unwrap(),
            None
        );
    }
}
