//! The output processor, the engine loop's third part (after the scheduler, which decides
//! who runs, and the executor, which runs one forward over them and draws a token per row):
//! it turns each row's drawn tokens into text, decides which rows finish (end of sequence, a
//! stop string, `max_tokens`, the context), assembles a request's completions once all its
//! samples have finished, and hands them and the streamed text to whoever asked
//! ([`Outcomes`]: the callers' replies on the first rank, nothing on the others).
//!
//! It knows nothing of tensors, caches or devices: a row here is its text and its tokens.

use crate::request::{Completion, FinishReason, GenerateRequest, RequestId};
use crate::sampling::Sampling;
use crate::tokenizer::{TextStream, Tokenizer};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};
use tokio::sync::{mpsc, oneshot};

/// A piece of streamed text of one sample.
#[derive(Clone, Debug, PartialEq)]
pub struct TextPiece {
    pub sample: usize,
    pub text: String,
}

/// One sample's output so far.
struct RowText {
    request: RequestId,
    /// Which sample of its request this row is.
    sample: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    top_logprobs: Vec<Vec<(u32, f32)>>,
    stream: TextStream,
    text: String,
}

/// A request whose samples are still running.
struct Open {
    sampling: Sampling,
    prompt_len: usize,
    done: Vec<Option<Completion>>,
}

/// One step's drawn token of a row: the token, its log-probability at temperature 1, and the
/// most likely tokens at its position when the request asked for them.
pub struct Drawn {
    pub token: u32,
    pub logprob: f32,
    pub top: Option<Vec<(u32, f32)>>,
}

/// What became of a step's rows.
pub struct Processed {
    /// Per row, in the batch's order: whether it finished.
    pub finished: Vec<bool>,
    /// The token each continuing row runs next, in the batch's order.
    pub next: Vec<u32>,
    /// The requests all of whose samples finished, with their completions.
    pub done: Vec<(RequestId, Vec<Completion>)>,
}

/// The rows' text and the open requests' completions, in the batch's row order.
pub struct OutputProcessor<'m> {
    tokenizer: &'m Tokenizer,
    rows: Vec<RowText>,
    open: HashMap<RequestId, Open>,
}

impl<'m> OutputProcessor<'m> {
    pub fn new(tokenizer: &'m Tokenizer) -> Self {
        OutputProcessor { tokenizer, rows: Vec::new(), open: HashMap::new() }
    }

    pub fn is_open(&self, id: RequestId) -> bool {
        self.open.contains_key(&id)
    }

    /// Open `request` and add a row per sample at the end of the batch.
    pub fn join(&mut self, id: RequestId, request: &GenerateRequest) {
        for sample in 0..request.n {
            self.rows.push(RowText {
                request: id,
                sample,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                top_logprobs: Vec::new(),
                stream: TextStream::new(),
                text: String::new(),
            });
        }
        let open =
            Open { sampling: request.sampling.clone(), prompt_len: request.prompt.len(), done: vec![None; request.n] };
        self.open.insert(id, open);
    }

    /// Add each row's drawn token, stream its new text to `on_text(request, sample, piece)`
    /// (never a split UTF-8 character, never past a stop string), and retire the rows that
    /// finished; `context` is the model's. The rows left keep their order.
    pub fn process(
        &mut self,
        drawn: Vec<Drawn>,
        context: usize,
        on_text: &mut dyn FnMut(RequestId, usize, &str),
    ) -> Result<Processed> {
        let eos = self.tokenizer.eos_ids();
        let mut processed = Processed {
            finished: Vec::with_capacity(drawn.len()),
            next: Vec::with_capacity(drawn.len()),
            done: Vec::new(),
        };
        let mut rows = Vec::with_capacity(self.rows.len());
        for (mut row, drawn) in std::mem::take(&mut self.rows).into_iter().zip(drawn) {
            let open = self.open.get_mut(&row.request).ok_or_else(|| Error::Input("row without request".into()))?;
            let token = drawn.token;
            row.tokens.push(token);
            row.logprobs.push(drawn.logprob);
            if let Some(top) = drawn.top {
                row.top_logprobs.push(top);
            }
            let mut finish = None;
            if !open.sampling.ignore_eos && eos.contains(&token) {
                finish = Some(FinishReason::Stop);
            } else if let Some(piece) = row.stream.push(self.tokenizer, token)? {
                row.text.push_str(&piece);
                if let Some(at) = open.sampling.stop.iter().filter_map(|s| row.text.find(s.as_str())).min() {
                    row.text.truncate(at);
                    finish = Some(FinishReason::Stop);
                } else {
                    on_text(row.request, row.sample, &piece);
                }
            }
            // The row's next position is prompt + generated tokens; it must fit the context.
            if finish.is_none()
                && (row.tokens.len() >= open.sampling.max_tokens || open.prompt_len + row.tokens.len() >= context)
            {
                finish = Some(FinishReason::Length);
            }
            processed.finished.push(finish.is_some());
            match finish {
                Some(finish) => {
                    open.done[row.sample] = Some(Completion {
                        tokens: row.tokens,
                        logprobs: row.logprobs,
                        top_logprobs: row.top_logprobs,
                        text: row.text,
                        finish,
                        weights_version: 0,
                    });
                    if open.done.iter().all(Option::is_some) {
                        let open = self.open.remove(&row.request).expect("request is open");
                        processed.done.push((row.request, open.done.into_iter().flatten().collect()));
                    }
                }
                None => {
                    processed.next.push(token);
                    rows.push(row);
                }
            }
        }
        self.rows = rows;
        Ok(processed)
    }

    /// Forget the `cancelled` requests; returns, per row, whether it stays.
    pub fn cancel(&mut self, cancelled: &HashSet<RequestId>) -> Vec<bool> {
        self.open.retain(|id, _| !cancelled.contains(id));
        let staying: Vec<bool> = self.rows.iter().map(|row| !cancelled.contains(&row.request)).collect();
        self.rows.retain(|row| !cancelled.contains(&row.request));
        staying
    }

    /// Forget every row and request, returning the requests that were open.
    pub fn abandon(&mut self) -> Vec<RequestId> {
        self.rows.clear();
        self.open.drain().map(|(id, _)| id).collect()
    }
}

/// A caller waiting for its request.
pub(crate) struct Waiter {
    pub reply: oneshot::Sender<Result<Vec<Completion>>>,
    pub text: Option<mpsc::UnboundedSender<TextPiece>>,
}

/// What becomes of the lanes' results: the callers' replies, or (other ranks) nothing.
pub(crate) trait Outcomes {
    fn piece(&mut self, id: RequestId, sample: usize, piece: &str);
    fn done(&mut self, id: RequestId, completions: Vec<Completion>);
    /// A lane's step failed: every request in it (`dropped`) is gone; the engine goes on.
    fn failed(&mut self, dropped: Vec<RequestId>, error: &Error);
}

/// The first rank's outcomes: each caller's text pieces and completions (stamped with the
/// weights version that sampled them), or the error that ended its request.
pub(crate) struct Replies<'w> {
    pub waiters: &'w mut HashMap<RequestId, Waiter>,
    pub version: u64,
}

impl Outcomes for Replies<'_> {
    fn piece(&mut self, id: RequestId, sample: usize, piece: &str) {
        if let Some(text) = self.waiters.get(&id).and_then(|w| w.text.as_ref()) {
            let _ = text.send(TextPiece { sample, text: piece.to_string() });
        }
    }

    fn done(&mut self, id: RequestId, mut completions: Vec<Completion>) {
        for completion in &mut completions {
            completion.weights_version = self.version;
        }
        if let Some(waiter) = self.waiters.remove(&id) {
            let _ = waiter.reply.send(Ok(completions));
        }
    }

    fn failed(&mut self, dropped: Vec<RequestId>, error: &Error) {
        tracing::error!("generation failed, {} requests dropped: {error}", dropped.len());
        for id in dropped {
            if let Some(waiter) = self.waiters.remove(&id) {
                let _ = waiter.reply.send(Err(Error::Generation(error.to_string())));
            }
        }
    }
}

/// A tensor-parallel rank other than the first: it answers no one.
pub(crate) struct Silent {
    pub rank: usize,
}

impl Outcomes for Silent {
    fn piece(&mut self, _: RequestId, _: usize, _: &str) {}

    fn done(&mut self, _: RequestId, _: Vec<Completion>) {}

    fn failed(&mut self, dropped: Vec<RequestId>, error: &Error) {
        tracing::error!(
            "tensor-parallel rank {}: generation failed, {} requests dropped: {error}",
            self.rank,
            dropped.len()
        );
    }
}
