//! The generated ids of one request → text deltas (stop strings matched on the answer),
//! tool-call events and log-probabilities, sent to the request's event channel as they are made.
use super::job::{Event, Job, JobKind};
use super::logprobs::{self, TokenLp};
use super::tools::{CallEvent, CallParser, Choice};
use crate::chat::parse::{Block, OutputParser};
use crate::chat::session::Halt;
use crate::chat::specials::Specials;
use crate::chat::stop::StopMatcher;
use crate::model::generate::StepLogprobs;
use crate::model::text::TextStream;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

/// Generated ids → text, tool-call and log-probability events.
pub struct Output<'a, 't> {
    parser: Option<OutputParser<'t>>,
    calls: Option<CallParser<'t>>,
    /// End the turn after the first tool call.
    one_call: bool,
    made_calls: usize,
    plain: TextStream<'t>,
    stop: StopMatcher,
    sp: &'a Specials,
    tok: &'t Tokenizer,
    /// Log-probabilities of answer tokens not yet sent.
    lps: Vec<TokenLp>,
    events: UnboundedSender<Event>,
}

impl<'a, 't> Output<'a, 't> {
    /// The output side of `job`: chat blocks parsed (tool calls too when it has tools), or plain
    /// text for a completion; events go to `job.events`.
    pub fn new(job: &Job, tok: &'t Tokenizer, sp: &'a Specials) -> Output<'a, 't> {
        let forced = job.tools.as_ref().and_then(|t| match &t.choice {
            Choice::Named(n) => Some(n.as_str()),
            _ => None,
        });
        Output {
            parser: match job.kind {
                JobKind::Chat { in_text } => {
                    let p = OutputParser::new(tok, sp, in_text);
                    Some(if job.tools.is_some() {
                        p.with_tools(forced.is_some())
                    } else {
                        p
                    })
                }
                JobKind::Completion => None,
            },
            calls: match (job.kind, &job.tools) {
                (JobKind::Chat { in_text }, Some(_)) => {
                    Some(CallParser::new(tok, sp, in_text, forced))
                }
                _ => None,
            },
            // one call only: a named choice, or parallel_tool_calls false
            one_call: forced.is_some() || job.tools.as_ref().is_some_and(|t| !t.parallel),
            made_calls: 0,
            plain: TextStream::new(tok),
            stop: StopMatcher::new(&job.stop),
            sp,
            tok,
            lps: Vec::new(),
            events: job.events.clone(),
        }
    }

    /// Tool calls ended so far.
    pub fn made_calls(&self) -> usize {
        self.made_calls
    }

    /// Whether the model wrote text outside any content block.
    pub fn strayed(&self) -> bool {
        self.parser.as_ref().is_some_and(|p| p.strayed())
    }

    pub fn push(&mut self, id: u32, lp: Option<&StepLogprobs>) -> anyhow::Result<()> {
        if let Some(lp) = lp {
            // answer tokens only: ordinary ids of a text block (or of a completion)
            let answer = !self.sp.is_special(id)
                && self
                    .parser
                    .as_ref()
                    .is_none_or(|p| p.block() == Block::Text);
            if answer {
                self.lps.push(logprobs::entry(self.tok, id, lp));
            }
        }
        if let Some(c) = self.calls.as_mut() {
            let events = c.push(id)?;
            if self.send_calls(events) && self.one_call {
                return Err(Halt::Stop.into());
            }
        }
        let piece = match self.parser.as_mut() {
            Some(p) => p.push(id)?.map(|pc| (pc.block, pc.text)),
            None if self.sp.is_special(id) => None,
            None => Some((Block::Text, self.plain.step(id)?)),
        };
        if let Some((block, text)) = piece {
            self.emit(block, &text);
            if self.stop.stopped() {
                return Err(Halt::Stop.into());
            }
        }
        Ok(())
    }

    pub fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.calls.as_mut() {
            let events = c.finish()?;
            self.send_calls(events);
        }
        let tail = match self.parser.as_mut() {
            Some(p) => p.finish()?.map(|pc| (pc.block, pc.text)),
            None => Some((Block::Text, self.plain.finish()?)),
        };
        if let Some((block, text)) = tail {
            self.emit(block, &text);
        }
        let held = self.stop.finish();
        self.send(Block::Text, held);
        Ok(())
    }

    fn emit(&mut self, block: Block, text: &str) {
        match block {
            Block::Text => {
                let t = self.stop.push(text);
                self.send(block, t);
            }
            Block::Thinking => self.send(block, text.to_string()),
            Block::Other => {}
        }
    }

    fn send(&mut self, block: Block, text: String) {
        let mut logprobs = if block == Block::Text {
            std::mem::take(&mut self.lps)
        } else {
            vec![]
        };
        if block == Block::Text && self.stop.stopped() {
            // the text before the matched stop string: the held tokens it covers keep their
            // log-probabilities, the ones inside the stop string get none
            let mut room = text.len();
            let keep = logprobs
                .iter()
                .take_while(|e| match room.checked_sub(e.bytes.len()) {
                    Some(r) => {
                        room = r;
                        true
                    }
                    None => false,
                })
                .count();
            logprobs.truncate(keep);
        }
        if !text.is_empty() || !logprobs.is_empty() {
            let _ = self.events.send(Event::Delta {
                block,
                text,
                logprobs,
            });
        }
    }

    /// Send tool-call events; whether a call ended among them.
    fn send_calls(&mut self, events: Vec<CallEvent>) -> bool {
        let mut ended = false;
        for e in events {
            if matches!(e, CallEvent::End(_)) {
                self.made_calls += 1;
                ended = true;
            }
            let _ = self.events.send(Event::Tool(e));
        }
        ended
    }

    /// Send the log-probabilities still held (of tokens whose text a stop string held back).
    pub fn flush_logprobs(&mut self) {
        if !self.lps.is_empty() {
            self.send(Block::Text, String::new());
        }
    }
}
