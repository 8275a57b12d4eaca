//! A running training's control over a Unix socket in its run directory (`control.sock`,
//! owner-only; a peer of another user is refused): the run's side (`serve`) and a client's
//! (`call`, what `wirl ctl` sends). One JSON request per connection, one JSON reply: the
//! operations of `wirl_trainer::Control`.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;
use wirl_trainer::config::TaskSet;
use wirl_trainer::{ApplyOptions, Control, Report, RunStatus};

/// The socket's name in the run directory.
pub const SOCKET: &str = "control.sock";
/// The largest request read (a task set is a few KiB).
const MAX_REQUEST_BYTES: u64 = 4 << 20;
/// Connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 8;

/// What a client asks of the run.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Status,
    Apply { tasks: TaskSet, options: ApplyOptions },
    Rollback,
    Pause,
    Resume,
    Stop,
}

/// The run's answer: whether it did what was asked, what it says, its status, an apply's report.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
}

/// Send one request to the run in `run_dir`, read its reply.
pub fn call(run_dir: &Path, request: &Request) -> anyhow::Result<Reply> {
    let path = run_dir.join(SOCKET);
    let mut stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "no training answers in {} (no {SOCKET}, or its process is gone): start one with `wirl train`, or \
             continue it with `wirl train --resume {0}`",
            run_dir.display()
        )
    })?;
    // A swap's checks re-score recent rollouts: allow them time.
    stream.set_read_timeout(Some(Duration::from_secs(600)))?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    // A busy run answers without reading the request and closes: the write may then fail
    // (a broken pipe) with the answer already waiting to be read, so a failed write is only
    // the error when no answer follows.
    let sent = stream.write_all(line.as_bytes()).and_then(|()| stream.shutdown(std::net::Shutdown::Write));
    // The reply is one line. A run that answered without reading all of the request (busy)
    // closes with bytes unread, which Linux reports to this side as a reset after the reply:
    // a whole line read before it is the answer.
    let mut text = Vec::new();
    let read = BufReader::new(stream.take(MAX_REQUEST_BYTES * 4)).read_until(b'\n', &mut text);
    // Nothing read and the connection reset: the process ended with the request unread (a
    // run that was stopping), told below as a close without an answer, not as a transport fault.
    let reset =
        |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe);
    let ended_unread =
        text.is_empty() && (read.as_ref().err().is_some_and(reset) || sent.as_ref().err().is_some_and(reset));
    if !text.ends_with(b"\n") && !ended_unread {
        sent.context("sending the request to the run")?;
        read.context("reading the run's reply")?;
    }
    if text.is_empty() {
        // Accepted, then the process ended before answering: a run that was stopping.
        bail!(
            "the run in {} closed the connection without answering (it was ending): `wirl ctl {0} status` tells \
             whether it still runs",
            run_dir.display()
        );
    }
    let text = String::from_utf8_lossy(&text);
    serde_json::from_str(&text).with_context(|| format!("the run's reply is not understood: {:.200}", text))
}

/// Removes the socket when the run ends.
pub struct Served {
    path: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serve `control` on `RUN_DIR/control.sock` from a thread, until the returned guard drops.
/// A live run already answering there is an error; a socket that cannot be made (a path
/// too long for one) is a warning: the run goes on without `wirl ctl`.
pub fn serve(run_dir: &Path, control: Control) -> anyhow::Result<Option<Served>> {
    let path = run_dir.join(SOCKET);
    if path.exists() {
        if UnixStream::connect(&path).is_ok() {
            bail!(
                "another wirl is training in {} (its {SOCKET} answers): stop it (`wirl ctl {0} stop`) first",
                run_dir.display()
            );
        }
        // Left by a run that was killed.
        std::fs::remove_file(&path).with_context(|| format!("removing the stale {}", path.display()))?;
    }
    let listener = match UnixListener::bind(&path) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!("no control socket at {} ({error}): `wirl ctl` cannot reach this run", path.display());
            return Ok(None);
        }
    };
    let served = Served { path: path.clone() };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new().name("wirl-control".into()).spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            if !same_user(&stream) {
                tracing::warn!("control socket: a connection from another user was refused");
                continue;
            }
            if busy.load(std::sync::atomic::Ordering::SeqCst) >= MAX_CONNECTIONS {
                // Answered without a thread; what the client sent is read first (as much as
                // has arrived), since closing over unread bytes resets the connection, and
                // the client could lose the answer.
                drain_available(&stream);
                let message =
                    format!("busy: {MAX_CONNECTIONS} control requests are being answered; try again in a moment");
                let _ = reply(&stream, &Reply { message: Some(message), ..Default::default() });
                let _ = stream.shutdown(std::net::Shutdown::Write);
                drain_available(&stream);
                continue;
            }
            let (control, busy) = (control.clone(), busy.clone());
            busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let spawned = std::thread::Builder::new().name("wirl-control-request".into()).spawn(move || {
                answer(stream, &control);
                busy.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
            if spawned.is_err() {
                tracing::warn!("control socket: cannot start a thread for a request");
            }
        }
    })?;
    Ok(Some(served))
}

/// Read one request, act on it, reply.
fn answer(stream: UnixStream, control: &Control) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let read = BufReader::new((&stream).take(MAX_REQUEST_BYTES)).read_line(&mut line);
    let request = match read {
        Err(error) => Err(format!("cannot read the request: {error}")),
        Ok(_) if !line.ends_with('\n') => {
            Err(format!("the request is not one line of at most {MAX_REQUEST_BYTES} bytes"))
        }
        Ok(_) => serde_json::from_str::<Request>(&line).map_err(|e| format!("not a control request: {e}")),
    };
    let answer = match request {
        Err(message) => Reply { message: Some(message), ..Default::default() },
        Ok(request) => act(request, control),
    };
    let _ = reply(&stream, &answer);
}

fn act(request: Request, control: &Control) -> Reply {
    let status = |result: Result<RunStatus, wirl_trainer::ControlError>| match result {
        Ok(status) => Reply { ok: true, status: Some(status), ..Default::default() },
        Err(error) => Reply { message: Some(format!("{error:#}")), ..Default::default() },
    };
    match request {
        Request::Status => status(control.status()),
        Request::Pause => status(control.pause()),
        Request::Resume => status(control.resume()),
        Request::Stop => {
            control.stop();
            Reply { ok: true, message: Some("stopping: the run checkpoints and ends".into()), ..Default::default() }
        }
        Request::Rollback => match control.rollback() {
            Ok(message) => Reply { ok: true, message: Some(message), ..Default::default() },
            Err(error) => Reply { message: Some(format!("{error:#}")), ..Default::default() },
        },
        Request::Apply { tasks, options } => {
            let dry_run = options.dry_run;
            match control.apply(tasks, &options) {
                Ok(report) => Reply {
                    ok: true,
                    message: (!dry_run).then(|| {
                        format!("staged as generation {}: switched in at the next step boundary", report.generation)
                    }),
                    report: Some(report),
                    ..Default::default()
                },
                Err(refusal) => Reply { message: Some(refusal.message), report: refusal.report, ..Default::default() },
            }
        }
    }
}

/// Read and drop what a client has sent so far, without waiting (at most a request's size).
fn drain_available(stream: &UnixStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut buffer = [0u8; 8192];
    let mut left = MAX_REQUEST_BYTES as usize;
    while left > 0 {
        match (&*stream).read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    let _ = stream.set_nonblocking(false);
}

fn reply(mut stream: &UnixStream, reply: &Reply) -> std::io::Result<()> {
    stream.write_all(serde_json::to_string(reply).unwrap_or_default().as_bytes())?;
    stream.write_all(b"\n")
}

/// Whether the peer runs as this process's user.
fn same_user(stream: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut credentials = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`, a valid ucred.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut credentials as *mut libc::ucred).cast(),
            &mut length,
        )
    };
    // SAFETY: getuid has no preconditions.
    done == 0 && credentials.uid == unsafe { libc::getuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that accepts a connection and ends before reading the request (it was
    /// stopping) resets the connection: `wirl ctl` says the run ended without answering,
    /// not that reading failed (the hot-swap test met this once in a fresh-clone CI run).
    #[test]
    fn a_run_ending_with_the_request_unread_is_told_as_ending() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join(SOCKET)).unwrap();
        let ending = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            // The request arrives and is never read; then the process "ends".
            std::thread::sleep(Duration::from_millis(200));
            drop(stream);
        });
        let Err(error) = call(dir.path(), &Request::Status) else { panic!("a reply was read, yet none was sent") };
        let error = error.to_string();
        ending.join().unwrap();
        assert!(error.contains("without answering (it was ending)"), "{error}");
    }
}
