//! The layers of `src/`, and the one rule between them: a module uses only modules below it.
//!
//! Every `crate::` path in `src/` is read (in `use` lines, inline like
//! `crate::secrets::read_secret(..)`, in test modules too; comments and string literals are
//! not code), and each arrow from one top-level module to another must point down
//! [`LAYERS`]. An arrow up is the start of a cycle across layers, so this test fails on it,
//! naming the file, the line and the two layers; a new top-level module fails it until it is
//! given a place. Cycles inside one folder (`src/sim/`, `src/plan/`) are that folder's own
//! business and are not looked at.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, lowest first; each may use only those before it. The
/// order is the data flow (words, settings, observe, plan, act, report), then what adapts
/// the world to it (the leader lock, the clients, the listeners, the control loop), then
/// what assembles and runs it (the command line, the wiring, the simulator, the commands).
const LAYERS: &[&str] = &[
    // The words of the domain and the one clock read: they use nothing of ours.
    "model",
    "clock",
    // Secret types, the port secrets are read through, reading them from the environment.
    "secrets",
    // The registry the clients count requests into and the server reads.
    "metrics",
    // The Consul document and its watcher.
    "config",
    // The read ports and one tick's snapshot.
    "observe",
    // The pure planner.
    "plan",
    // The write ports, the bundle of every port, and carrying out a plan.
    "act",
    // Log lines, the tick view, recording into the metrics.
    "report",
    // The leader lock's ports, session, fence and term: it drives any controller.
    "leader",
    // The real clients: they implement the ports above, and decide nothing.
    "clients",
    // The webhook receiver: it only turns deliveries into hints.
    "webhook",
    // One tick after another, over the ports.
    "control_loop",
    // The `--listen` server.
    "serve",
    // Process settings.
    "cli",
    // Builds the daemon's parts from settings; runs nothing.
    "wiring",
    // The twins and the seeded world: beside the product, which never uses them.
    "sim",
    // The commands: the only place that runs what the wiring builds, and the only way into
    // the simulator (`simulate`, with the `sim` feature).
    "commands",
];

/// An arrow from one top-level module to another, where it was written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Arrow {
    from: String,
    to: String,
    file: String,
    line: usize,
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The source with comments and the contents of string and char literals blanked out
/// (newlines kept, so line numbers still hold).
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(&other) => out.push(blank(other)),
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&inside) = chars.get(i) {
                    out.push(blank(inside));
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal ('\'', '\n', '\u{..}'); lifetimes have no backslash.
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The first segment of every path a `crate::` starts, with the offset it was written at:
/// `crate::plan::X` gives `plan`, `crate::{act::A, report}` gives `act` and `report`.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let start = from + at;
        from = start + "crate::".len();
        // `$crate::` (in macros) and `runner_scaler::crate_x` are not ours to read.
        let before = start.checked_sub(1).map(|i| bytes[i]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$') {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            // The top level of a brace group: nested groups belong to their first segment.
            let mut depth = 0usize;
            let mut segment_start = true;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => segment_start = true,
                    c if segment_start && (c.is_ascii_alphabetic() || c == '_') => {
                        let name: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        found.push((name, from + 1 + k));
                        segment_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((name, start));
            }
        }
    }
    found
}

/// The top-level module a file under `src/` belongs to; `None` for the crate roots.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative
        .components()
        .next()?
        .as_os_str()
        .to_str()?
        .to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "main").then_some(name)
}

fn arrows(src: &Path) -> Vec<Arrow> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut arrows = Vec::new();
    for file in &files {
        let Some(from) = top_module(src, file) else {
            continue;
        };
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for (to, offset) in crate_paths(&code) {
            if to == from || to == "self" || to == "super" {
                continue;
            }
            arrows.push(Arrow {
                from: from.clone(),
                to,
                file: file.strip_prefix(src).unwrap().display().to_string(),
                line: code[..offset].matches('\n').count() + 1,
            });
        }
    }
    arrows
}

/// Every arrow that points up the layers, or at or from a module without a layer.
fn upward(arrows: &[Arrow]) -> Vec<String> {
    let rank = |module: &str| LAYERS.iter().position(|m| *m == module);
    let mut wrong = BTreeSet::new();
    for arrow in arrows {
        match (rank(&arrow.from), rank(&arrow.to)) {
            (Some(from), Some(to)) if to < from => {}
            (Some(_), Some(_)) => {
                wrong.insert(format!(
                    "src/{}:{}: {} uses crate::{}, a layer above it",
                    arrow.file, arrow.line, arrow.from, arrow.to
                ));
            }
            (None, _) => {
                wrong.insert(format!(
                    "src/{}: module {} has no place in LAYERS",
                    arrow.file, arrow.from
                ));
            }
            (_, None) => {
                wrong.insert(format!(
                    "src/{}:{}: crate::{} is not a module with a place in LAYERS",
                    arrow.file, arrow.line, arrow.to
                ));
            }
        }
    }
    wrong.into_iter().collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let arrows = arrows(&src());
    assert!(
        arrows.len() > 100,
        "only {} arrows read: the reader is broken",
        arrows.len()
    );
    let wrong = upward(&arrows);
    assert!(
        wrong.is_empty(),
        "{} arrows point up the layers (tests/layers.rs says the order):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_layer() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|file| top_module(&src(), file))
        .collect();
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|m| !LAYERS.contains(&m.as_str()))
        .collect();
    assert!(unplaced.is_empty(), "without a layer: {unplaced:?}");
    let gone: Vec<&&str> = LAYERS.iter().filter(|m| !modules.contains(**m)).collect();
    assert!(gone.is_empty(), "layers without a module: {gone:?}");
}

/// The reader sees what the daemon's code can write: an inline path, a path in a brace group
/// (nested ones too), a `use` over several lines; and not what only looks like one.
#[test]
fn the_reader_finds_inline_and_grouped_paths_and_skips_comments_and_strings() {
    let code = code_only(
        r##"
use crate::plan::{Plan, reap::decide};
use crate::{
    act::Credential,
    report::{self, TickView},
};
fn f() { crate::secrets::read_secret("X"); }
// crate::sim::world is only named in a comment
/// [`crate::commands`] in a doc comment
const S: &str = "crate::wiring in a string";
const R: &str = r#"crate::cli in a raw "string""#;
/* crate::serve in a block */
const C: char = '"'; fn g() { crate::metrics::count(); }
"##,
    );
    let names: Vec<String> = crate_paths(&code).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["plan", "act", "report", "secrets", "metrics"],
        "{code}"
    );
}

/// An arrow up is caught, and one down is not: the check has teeth.
#[test]
fn an_arrow_up_the_layers_is_caught() {
    let arrow = |from: &str, to: &str| Arrow {
        from: from.into(),
        to: to.into(),
        file: format!("{from}.rs"),
        line: 1,
    };
    assert!(upward(&[arrow("control_loop", "plan")]).is_empty());
    let wrong = upward(&[arrow("plan", "control_loop")]);
    assert_eq!(
        wrong,
        ["src/plan.rs:1: plan uses crate::control_loop, a layer above it"]
    );
    assert_eq!(upward(&[arrow("clients", "sim")]).len(), 1);
    assert_eq!(upward(&[arrow("newcomer", "model")]).len(), 1);
}
