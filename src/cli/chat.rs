//! `inkling-wgpu chat`: an interactive chat in Inkling's TMLv0 format. The conversation is kept as
//! token ids and the model's KV cache and conv states follow it, so each turn prefills only its
//! new tokens. With a terminal on stdin it reads through a line editor; otherwise each line of
//! stdin is one message (for scripts). Ctrl-C stops the current answer.
use super::load::{open_tokenizer, random_seed, with_chat_model, ChatModel, ModelArgs};
use super::output::{errln, StdoutError};
use super::penalties::command_sampling;
use crate::chat::parse::{Block, OutputParser};
use crate::chat::session::{Finish, Halt, Session};
use crate::chat::{Effort, Message, Role};
use crate::model::generate::GenerateParams;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Thinking effort: a number in [0, 1] or none (0), minimal (0.1), low (0.2), medium (0.7),
    /// high (0.9), xhigh or max (0.99). `none` answers without a thinking block.
    #[arg(allow_negative_numbers = true, long, default_value = "high", value_parser = Effort::parse)]
    pub effort: Effort,
    /// Print the model's thinking (hidden by default).
    #[arg(long)]
    pub show_thinking: bool,
    /// Maximum tokens per answer (thinking included).
    #[arg(
        long,
        default_value_t = 1024,
        allow_negative_numbers = true,
        value_parser = super::values::parse_tokens
    )]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy (default: generation_config.json's when it sets do_sample,
    /// 1 when it sets do_sample without a temperature, else 0).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_temperature)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 or -1 = off; default: generation_config.json's when it
    /// sets do_sample, 50 when it sets do_sample without a top_k, as transformers; else 0).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_top_k)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1] (1 = off; default: generation_config.json's when it sets
    /// do_sample, else 1).
    #[arg(long, allow_negative_numbers = true, value_parser = super::values::parse_top_p)]
    pub top_p: Option<f32>,
    #[command(flatten)]
    pub penalties: super::penalties::PenaltyArgs,
    /// PRNG seed for sampling: turn n uses seed + n (default: a fresh random seed, shown in each
    /// turn's stats line when sampling).
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
}

/// The most tokens that close a model turn in the history ([`crate::chat::Renderer::close_model_turn`]:
/// end of message and end of sampling), kept free in the context so that the history never
/// outgrows it.
const CLOSE_TOKENS: usize = 2;

const HELP: &str = "commands: /clear (start a new conversation), /exit (or Ctrl-D), /help; \
                    Ctrl-C stops the current answer, a second one within 2 s quits";

/// A second SIGINT within this many milliseconds of the one that stopped an answer ends the
/// program (a piped chat of many lines is otherwise stopped one answer at a time).
const QUIT_WINDOW_MS: u64 = 2000;

/// What SIGINT does in `chat`: while an answer is being generated it sets `cancel` (the answer
/// stops, the conversation goes on); otherwise, or within [`QUIT_WINDOW_MS`] of the SIGINT that
/// stopped an answer, it ends the program with status 130.
#[derive(Clone, Default)]
struct Interrupt {
    /// Set by SIGINT while an answer is being generated.
    cancel: Arc<AtomicBool>,
    /// Whether an answer is being generated.
    generating: Arc<AtomicBool>,
}

impl Interrupt {
    /// Install the SIGINT handler over a fresh pair of flags.
    fn install() -> anyhow::Result<Interrupt> {
        let i = Interrupt::default();
        let (cancel, generating) = (i.cancel.clone(), i.generating.clone());
        let start = std::time::Instant::now();
        // ms after `start` of the last SIGINT that stopped an answer, 0 for none
        let last = std::sync::atomic::AtomicU64::new(0);
        // SAFETY: the handler only touches atomics, reads the monotonic clock (clock_gettime) and
        // calls `low_level::exit` (`_exit`), all async-signal-safe.
        unsafe {
            signal_hook::low_level::register(signal_hook::consts::SIGINT, move || {
                let now = start.elapsed().as_millis() as u64 + 1;
                let prev = last.load(Ordering::SeqCst);
                let again = prev != 0 && now - prev <= QUIT_WINDOW_MS;
                if generating.load(Ordering::SeqCst) && !again {
                    last.store(now, Ordering::SeqCst);
                    cancel.store(true, Ordering::SeqCst);
                } else {
                    signal_hook::low_level::exit(130);
                }
            })?;
        }
        Ok(i)
    }
}

/// Where the user's lines come from.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    /// Piped standard input and the number of lines read so far.
    Lines(std::io::StdinLock<'static>, usize),
}

impl Input {
    /// The next line; `None` at the end of input. A line that is not UTF-8 is reported on stderr
    /// and skipped (the conversation goes on): from the line editor as typed or pasted, from a
    /// pipe with its line number and the offset of the first bad byte.
    fn next(&mut self) -> anyhow::Result<Option<String>> {
        match self {
            Input::Editor(ed) => loop {
                match ed.readline("> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = ed.add_history_entry(line.as_str());
                        }
                        return Ok(Some(line));
                    }
                    // Ctrl-C at the prompt clears the line
                    Err(rustyline::error::ReadlineError::Interrupted) => continue,
                    Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                    Err(rustyline::error::ReadlineError::Io(e))
                        if e.kind() == std::io::ErrorKind::InvalidData =>
                    {
                        errln!("warning: input is not UTF-8; line ignored");
                    }
                    Err(e) => return Err(e.into()),
                }
            },
            Input::Lines(lock, n) => loop {
                let Some(line) = read_input_line(lock)? else {
                    return Ok(None);
                };
                *n += 1;
                match line {
                    Ok(text) => return Ok(Some(text)),
                    Err(at) => {
                        errln!("warning: stdin line {n}: input is not UTF-8 at byte {at}; line ignored")
                    }
                }
            },
        }
    }
}

/// One line of piped chat input from `r`: `None` at the end of input, `Some(Ok(text))` without
/// its `\n` or `\r\n`, or `Some(Err(offset))` for a line that is not UTF-8 (the offset of its
/// first bad byte). Errors: the reader's own. The bytes of a bad line are consumed, so reading
/// goes on with the next line.
pub fn read_input_line(r: &mut impl BufRead) -> std::io::Result<Option<Result<String, usize>>> {
    let mut bytes = Vec::new();
    if r.read_until(b'\n', &mut bytes)? == 0 {
        return Ok(None);
    }
    Ok(Some(match String::from_utf8(bytes) {
        Ok(line) => Ok(line.trim_end_matches(['\n', '\r']).to_string()),
        Err(e) => Err(e.utf8_error().valid_up_to()),
    }))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (tok, renderer) = open_tokenizer(&args.model.dir()?)?;
    with_chat_model(&args.model, 1, &tok, &renderer, |cm| chat(&args, cm))
}

fn chat(args: &Args, cm: ChatModel<'_>) -> anyhow::Result<ExitCode> {
    let interactive = std::io::stdin().is_terminal();
    let color = std::io::stdout().is_terminal();
    let r = cm.renderer;
    let sp = r.specials().clone();
    let sampling = command_sampling(
        &cm.dir,
        &cm.generation,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        &args.penalties,
    )?;
    let sampled = sampling.temperature > 0.0;
    let seed = args
        .seed
        .unwrap_or_else(|| if sampled { random_seed() } else { 0 });
    let params = GenerateParams {
        max_new_tokens: args.max_tokens,
        sampling,
        seed,
        eos_ids: cm.stop_ids.clone(),
    };
    let effort = Some(args.effort);
    // system message(s) and the effort line: every conversation starts with them
    let system: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new(Role::System, s.as_str()))
        .collect();
    let prefix = r.render(&system, effort)?;
    let gen_prompt = r.generation_prompt(effort);
    let in_text = gen_prompt.last() == Some(&sp.content_text);
    let interrupt = Interrupt::install()?;
    let mut input = if interactive {
        errln!(
            "chat with {} ({}, {} tokens of context); {HELP}",
            cm.dir.display(),
            cm.model.adapter(),
            cm.ctx
        );
        Input::Editor(Box::new(rustyline::DefaultEditor::new()?))
    } else {
        Input::Lines(std::io::stdin().lock(), 0)
    };
    let mut session = Session::new(cm.model);
    let mut history = prefix.clone();
    let mut turn_no = 0u64;
    let stdout = std::io::stdout();
    // the warning that the model writes outside the format, once per session
    let mut warned = false;
    // "thinking…" on a terminal while hidden thinking is generated (nothing when stderr is piped)
    let spin = !args.show_thinking && std::io::stderr().is_terminal();
    while let Some(line) = input.next()? {
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => {
                errln!("{HELP}");
                continue;
            }
            "/clear" => {
                history = prefix.clone();
                errln!("(new conversation)");
                continue;
            }
            t if t.starts_with('/') => {
                errln!("unknown command {t}; {HELP}");
                continue;
            }
            _ => {}
        }
        let user = match r.message(&Message::new(Role::User, line.as_str())) {
            Ok(ids) => ids,
            Err(e) => {
                errln!("error: {e:#}");
                continue;
            }
        };
        let mut prompt = history.clone();
        prompt.extend(user);
        prompt.extend_from_slice(&gen_prompt);
        // room for one answer token and the turn's closing tokens, which stay in the history
        if prompt.len() + 1 + CLOSE_TOKENS > cm.ctx {
            let msg = format!(
                "the conversation would be {} tokens with this message, and the context holds {} \
                 (--ctx, at most the model's max_position_embeddings)",
                prompt.len() + 1 + CLOSE_TOKENS,
                cm.ctx
            );
            if !interactive {
                anyhow::bail!("{msg}; chat stops here: send the remaining lines to a new chat");
            }
            errln!("{msg}; /clear starts a new one");
            continue;
        }
        let mut p = params.clone();
        p.max_new_tokens = p.max_new_tokens.min(cm.ctx - prompt.len() - CLOSE_TOKENS);
        p.seed = seed.wrapping_add(turn_no);
        turn_no += 1;
        let mut parser = OutputParser::new(cm.tok, &sp, in_text);
        let mut shown = Shown::new(args.show_thinking, color);
        let mut thinking_tokens = 0usize;
        let mut spinner: Option<indicatif::ProgressBar> = None;
        interrupt.cancel.store(false, Ordering::SeqCst);
        interrupt.generating.store(true, Ordering::SeqCst);
        let streamed_before = session.model().stream_stats();
        let turn = session.generate(&prompt, &p, &mut |id| {
            if interrupt.cancel.load(Ordering::SeqCst) {
                return Err(Halt::Cancelled.into());
            }
            let piece = parser.push(id)?;
            if parser.block() == Block::Thinking && !sp.is_special(id) {
                thinking_tokens += 1;
            }
            if spin {
                match (parser.block() == Block::Thinking, &spinner) {
                    (true, None) => {
                        let pb = indicatif::ProgressBar::new_spinner().with_message("thinking…");
                        pb.enable_steady_tick(std::time::Duration::from_millis(120));
                        spinner = Some(pb);
                    }
                    (false, Some(pb)) => {
                        pb.finish_and_clear();
                        spinner = None;
                    }
                    _ => {}
                }
            }
            if let Some(piece) = piece {
                shown
                    .print(&mut stdout.lock(), piece.block, &piece.text)
                    .map_err(StdoutError)?;
            }
            Ok(())
        });
        interrupt.generating.store(false, Ordering::SeqCst);
        if let Some(pb) = spinner.take() {
            pb.finish_and_clear();
        }
        let turn = turn?;
        if let Some(piece) = parser.finish()? {
            shown
                .print(&mut stdout.lock(), piece.block, &piece.text)
                .map_err(StdoutError)?;
        }
        shown.end(&mut stdout.lock()).map_err(StdoutError)?;
        if parser.strayed() && !warned {
            errln!(
                "warning: the model wrote text outside any content block (it does not follow \
                 Inkling's chat format); that text is shown as the answer"
            );
            warned = true;
        }
        history = prompt;
        history.extend_from_slice(&turn.generated_ids);
        let close = r.close_model_turn(&history);
        history.extend(close);
        let s = &turn.stats;
        let finish = match turn.finish {
            Finish::Eos => "end",
            Finish::Length if p.max_new_tokens < args.max_tokens => "context full",
            Finish::Length => "max tokens",
            Finish::Halted(_) => "stopped",
        };
        let experts = match (streamed_before, session.model().stream_stats()) {
            (Some(a), Some(b)) => format!(" | experts {}", b.since(&a).brief()),
            _ => String::new(),
        };
        errln!(
            "[prompt {} tok ({} reused) {:.1} tok/s | {} tok {:.1} tok/s{} | {finish} | context {}/{}{experts}{}]",
            s.prompt_tokens,
            turn.reused,
            if s.prefill_s > 0.0 {
                s.prompt_tokens as f64 / s.prefill_s
            } else {
                0.0
            },
            s.generated_tokens,
            s.decode_tok_s,
            if thinking_tokens > 0 {
                format!(" ({thinking_tokens} thinking)")
            } else {
                String::new()
            },
            history.len(),
            cm.ctx,
            if sampled {
                format!(" | seed {}", p.seed)
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints an answer's blocks: text always, thinking when asked (dim on a terminal, between
/// `[thinking]` lines otherwise); ends the answer with a newline.
struct Shown {
    thinking: bool,
    color: bool,
    in_thinking: bool,
}

impl Shown {
    fn new(thinking: bool, color: bool) -> Shown {
        Shown {
            thinking,
            color,
            in_thinking: false,
        }
    }

    fn print(&mut self, o: &mut impl Write, block: Block, text: &str) -> std::io::Result<()> {
        match block {
            Block::Thinking if self.thinking => {
                if !self.in_thinking {
                    o.write_all(if self.color {
                        b"\x1b[2m"
                    } else {
                        b"[thinking]\n"
                    })?;
                    self.in_thinking = true;
                }
                o.write_all(text.as_bytes())?;
            }
            Block::Text => {
                self.close_thinking(o)?;
                o.write_all(text.as_bytes())?;
            }
            _ => return Ok(()),
        }
        o.flush()
    }

    fn close_thinking(&mut self, o: &mut impl Write) -> std::io::Result<()> {
        if self.in_thinking {
            o.write_all(if self.color {
                b"\x1b[0m\n"
            } else {
                b"\n[/thinking]\n"
            })?;
            self.in_thinking = false;
        }
        Ok(())
    }

    fn end(&mut self, o: &mut impl Write) -> std::io::Result<()> {
        self.close_thinking(o)?;
        o.write_all(b"\n")?;
        o.flush()
    }
}
