//! The processes and files a command under test leaves behind, read from `/proc` and the file
//! system: what the signal tests check after a run was interrupted.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// A `/proc` entry: parent, process group, zombie or not, command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Proc {
    pub ppid: u32,
    pub pgrp: u32,
    pub zombie: bool,
    pub cmdline: String,
}

/// Every process in `/proc`, by pid.
pub fn processes() -> BTreeMap<u32, Proc> {
    let mut all = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // A process that exits while it is read leaves a short or empty line: skip it.
        let Some(fields) = stat
            .rfind(')')
            .map(|close| stat[close + 1..].split_whitespace().collect::<Vec<&str>>())
        else {
            continue;
        };
        let (Some(state), Some(Ok(ppid)), Some(Ok(pgrp))) = (
            fields.first(),
            fields.get(1).map(|f| f.parse()),
            fields.get(2).map(|f| f.parse()),
        ) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
            .unwrap_or_default();
        // A killed process's main thread can be a zombie while another thread still exits and
        // holds its files (a listening socket): it is gone once every thread is.
        let zombie = *state == "Z"
            && std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|tasks| {
                    tasks.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|st| {
                            st.rfind(')').is_some_and(|c| {
                                matches!(st[c + 1..].split_whitespace().next(), Some("Z" | "X"))
                            })
                        })
                    })
                })
                .unwrap_or(true);
        all.insert(
            pid,
            Proc {
                zombie,
                ppid,
                pgrp,
                cmdline,
            },
        );
    }
    all
}

/// Every living process below `root`.
pub fn descendants(root: u32) -> BTreeMap<u32, Proc> {
    let all = processes();
    let mut found: BTreeMap<u32, Proc> = BTreeMap::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for (pid, p) in &all {
            if p.ppid == parent && !p.zombie && found.insert(*pid, p.clone()).is_none() {
                frontier.push(*pid);
            }
        }
    }
    found
}

/// What `dir` still holds: every path below it, relative.
pub fn contents(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            found.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: i32) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// The exit status of `child`, which must end within 30 s of a signal that `what` names.
pub fn ended_after(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not end within 30 s of the signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
