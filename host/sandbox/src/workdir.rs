//! A program's working directory for one run: the files a client sent it (SandboxFusion's
//! `files`), where it may write what the client fetches back (`fetch_files`).
//!
//! The host owns the directory: it makes it before the run, preopens it as the guest's `/`
//! (so `open("input.txt")` and `open("/input.txt")` are the same file, and nothing else of
//! the host's filesystem exists for the guest), and removes it after. Writing is bounded from
//! outside the interpreter, like everything else a program does: the host measures the
//! directory every few milliseconds during the run and cuts the program (an `output-limit`
//! termination) once it holds more than `max_bytes` or `max_entries`. One write call can
//! overshoot by its own size, which the memory limit bounds.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a run's directory is measured while the program runs.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// A directory the host made for one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workdir {
    /// The directory on the host; the guest sees it as `/`.
    pub path: PathBuf,
    /// Most bytes of files the directory may hold during the run (what the client sent
    /// included).
    pub max_bytes: u64,
    /// Most files and directories it may hold.
    pub max_entries: u64,
}

/// What a directory holds, counted up to a bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub entries: u64,
}

impl Workdir {
    /// Bytes and entries under the directory, without following links; the walk stops
    /// once it has seen more than `max_entries` (a program that makes a million files must
    /// not make the host walk them all every few milliseconds).
    pub fn usage(&self) -> Usage {
        let mut usage = Usage::default();
        let mut pending = vec![self.path.clone()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                usage.entries += 1;
                if usage.entries > self.max_entries {
                    return usage;
                }
                let Ok(meta) = entry.path().symlink_metadata() else { continue };
                if meta.is_dir() {
                    pending.push(entry.path());
                } else {
                    usage.bytes = usage.bytes.saturating_add(meta.len());
                }
            }
        }
        usage
    }

    /// Why the directory is over its bounds, if it is.
    pub fn over(&self) -> Option<String> {
        let usage = self.usage();
        if usage.entries > self.max_entries {
            Some(format!("made more than {} files and directories", self.max_entries))
        } else if usage.bytes > self.max_bytes {
            Some(format!("wrote more than {} bytes of files", self.max_bytes))
        } else {
            None
        }
    }

    /// The path on the host of `name` (relative, as the guest or a client names it, with or
    /// without a leading `/`), if it stays inside the directory: no `..`, no empty name.
    pub fn resolve(&self, name: &str) -> Option<PathBuf> {
        inside(name).map(|path| self.path.join(path))
    }
}

/// `name` (as the guest or a client writes it, with or without a leading `/`) as a path
/// relative to a run's directory, if it names something inside it: no `..`, not empty.
pub fn inside(name: &str) -> Option<&Path> {
    use std::path::Component;
    let path = Path::new(name.trim_start_matches('/'));
    let inside = path.components().any(|part| matches!(part, Component::Normal(_)))
        && path.components().all(|part| matches!(part, Component::Normal(_) | Component::CurDir));
    inside.then_some(path)
}

impl Workdir {}

/// A run's directory as its store watches it.
pub(crate) struct WorkdirWatch {
    workdir: Workdir,
    next_check: Instant,
    /// Why the program was cut, once it was.
    pub(crate) over: Option<String>,
}

impl WorkdirWatch {
    pub(crate) fn new(workdir: Workdir) -> Self {
        WorkdirWatch { workdir, next_check: Instant::now(), over: None }
    }

    /// Measure the directory if it is time to; true when it is over its bounds.
    pub(crate) fn check(&mut self, now: Instant) -> bool {
        if self.over.is_none() && now >= self.next_check {
            self.over = self.workdir.over();
            self.next_check = now + CHECK_EVERY;
        }
        self.over.is_some()
    }

    /// The final measure, after the run: a last write between two checks counts too.
    pub(crate) fn finish(&mut self) -> Option<String> {
        if self.over.is_none() {
            self.over = self.workdir.over();
        }
        self.over.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workdir(dir: &Path) -> Workdir {
        Workdir { path: dir.to_path_buf(), max_bytes: 100, max_entries: 3 }
    }

    #[test]
    fn names_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let w = workdir(dir.path());
        assert_eq!(w.resolve("a/b.txt"), Some(dir.path().join("a/b.txt")));
        assert_eq!(w.resolve("/a.txt"), Some(dir.path().join("a.txt")));
        assert_eq!(w.resolve("./a").map(|p| p.ends_with("a")), Some(true));
        for bad in ["", "/", ".", "./", "../x", "a/../../x", "a/.."] {
            assert_eq!(w.resolve(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn usage_counts_bytes_and_entries_and_stops_early() {
        let dir = tempfile::tempdir().unwrap();
        let w = workdir(dir.path());
        std::fs::write(dir.path().join("a"), [0u8; 60]).unwrap();
        assert_eq!(w.over(), None);
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/b"), [0u8; 60]).unwrap();
        assert_eq!(w.usage(), Usage { bytes: 120, entries: 3 });
        assert!(w.over().unwrap().contains("100 bytes"));
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), b"").unwrap();
        }
        assert_eq!(w.usage().entries, 4, "the walk stops past the bound");
        assert!(w.over().unwrap().contains("3 files"));
    }

    #[test]
    fn links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![0u8; 1000]).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        let w = workdir(dir.path());
        assert_eq!(w.over(), None, "{:?}", w.usage());
    }
}
