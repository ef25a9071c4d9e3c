//! The Rust core's layers, as `rust/src/lib.rs` lists them: each module may use only itself and
//! the modules before it in that list (`crate::` paths, in `use` lines or written out). Read from
//! the source, like tests/architecture/test_layers.py does for the Python package.

use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rust").join("src")
}

/// The layer order documented in lib.rs: its `//! - [`name`]` (or `` `name` ``) list items.
fn documented_layers() -> Vec<String> {
    let lib = fs::read_to_string(src().join("lib.rs")).expect("rust/src/lib.rs");
    lib.lines()
        .filter_map(|line| line.strip_prefix("//! - "))
        .filter_map(|item| {
            let item = item.trim_start_matches('[');
            let name = item.strip_prefix('`')?.split('`').next()?;
            Some(name.to_string())
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`ort/histogram/tests.rs` -> `ort`).
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(src()).expect("under rust/src");
    let first = rel.components().next().expect("non-empty path");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// The modules a source line names through `crate::` (comments skipped): `use crate::{a, b::c}` too.
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn lib_rs_documents_every_module_once() {
    let layers = documented_layers();
    let mut modules: Vec<String> = fs::read_dir(src())
        .expect("rust/src")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.file_name().is_some_and(|n| n != "lib.rs"))
        .map(|p| module_of(&p))
        .collect();
    modules.sort();
    modules.dedup();
    let mut documented = layers.clone();
    documented.sort();
    assert_eq!(documented, modules, "lib.rs's layer list and the folders of rust/src differ");
    assert_eq!(documented.len(), layers.len(), "a module listed twice in lib.rs");
}

#[test]
fn crate_paths_point_only_to_earlier_layers() {
    let layers = documented_layers();
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let mut upward = Vec::new();
    for file in files.iter().filter(|f| f.file_name().is_some_and(|n| n != "lib.rs")) {
        let from = module_of(file);
        let from_rank = rank(&from).unwrap_or_else(|| panic!("{from} is not in lib.rs's layer list"));
        let text = fs::read_to_string(file).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            for to in crate_paths(line) {
                if let Some(to_rank) = rank(&to) {
                    if to_rank > from_rank {
                        upward.push(format!("{}:{}: {from} uses {to}", file.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(upward.is_empty(), "uses of a later layer:\n{}", upward.join("\n"));
}

#[test]
fn the_reader_finds_grouped_and_written_out_paths() {
    assert_eq!(crate_paths("use crate::{numeric::view, ort::minmax};"), ["numeric", "ort"]);
    assert_eq!(crate_paths("let x = crate::stream::levels(1); // crate::python"), ["stream"]);
    assert_eq!(documented_layers().first().map(String::as_str), Some("numeric"));
}

/// No source file grows past 600 lines, as in the Python package: a file that long does two jobs.
#[test]
fn no_source_file_is_longer_than_600_lines() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = fs::read_to_string(p).expect("a source file").lines().count();
            (n > 600).then(|| format!("{}: {n} lines", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by what they compute:\n{}", long.join("\n"));
}
