//! Layers point one way: no two source files of a crate of the workspace
//! import each other, directly or around a loop. Every member of the
//! workspace's `Cargo.toml` is checked, from its `src/lib.rs` and its
//! `src/main.rs`.
//!
//! Each `.rs` file is a node. An edge `a -> b` is a path in `a` that names
//! something in `b`: a `use` declaration (`crate::…`, `super::…`, `self::…`,
//! or a child module's name) or a path written inline (`crate::x::f()`,
//! `super::T`, `child::f()`). `mod child;` alone is no edge: declaring a
//! module is not using it. A path resolves to the deepest file module it
//! names, so `crate::worker::Stats` is an edge to `worker/mod.rs` and a
//! `pub use` there is that file's own edge onward. The test fails naming
//! each loop it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source roots of the workspace's crates, each with its root file
/// (`lib.rs`, `main.rs` or both), as paths under the workspace.
fn crate_roots(workspace: &Path) -> Vec<(String, &'static str)> {
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    let members = members(&manifest);
    assert!(!members.is_empty(), "the workspace lists no members");
    let mut roots = Vec::new();
    for member in members {
        let src = if member == "." {
            "src".to_string()
        } else {
            format!("{member}/src")
        };
        let found: Vec<&str> = ["lib.rs", "main.rs"]
            .into_iter()
            .filter(|file| workspace.join(&src).join(file).is_file())
            .collect();
        assert!(
            !found.is_empty(),
            "member {member} has no src/lib.rs or src/main.rs"
        );
        roots.extend(found.into_iter().map(|file| (src.clone(), file)));
    }
    roots
}

/// The paths in the `members = [...]` list of a workspace manifest (a
/// list of plain strings, on one line or several).
fn members(manifest: &str) -> Vec<String> {
    let line = manifest
        .lines()
        .position(|line| {
            line.trim_start()
                .strip_prefix("members")
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .expect("the manifest has a members list");
    let list: String = manifest
        .lines()
        .skip(line)
        .map(|line| line.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let open = list.find('[').expect("the members list opens") + 1;
    let close = open + list[open..].find(']').expect("the members list closes");
    list[open..close]
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

/// Folders whose `mod.rs` still defines what its children use while it
/// re-exports theirs (a loop between the two), left to their owners this
/// round: each entry goes once its folder's loops are gone (the test says
/// so). A loop through any other file, or out of its folder, fails.
/// The fix is the same each time: move what the children share out of
/// `mod.rs` into a file of its own below them.
const NOT_YET_ONE_WAY: &[(&str, &str)] = &[];

#[test]
fn no_two_files_import_each_other() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut loops = BTreeSet::new();
    for (root, root_file) in crate_roots(&workspace) {
        let graph = ModuleGraph::read(&workspace.join(&root), root_file);
        for graph in graph.levels() {
            for cycle in graph.cycles() {
                let names: Vec<String> = cycle
                    .iter()
                    .map(|m| format!("{root}/{}", graph.files[m]))
                    .collect();
                loops.insert(names);
            }
        }
    }
    let within =
        |folder: &str, names: &[String]| names.iter().all(|n| n.starts_with(folder) && n != folder);
    let show = |names: &Vec<String>| format!("{} -> {}", names.join(" -> "), names[0]);
    let unexpected: Vec<String> = loops
        .iter()
        .filter(|names| {
            !NOT_YET_ONE_WAY
                .iter()
                .any(|(folder, _)| within(folder, names))
        })
        .map(show)
        .collect();
    assert!(
        unexpected.is_empty(),
        "{} import loop(s) between source files or module folders (break each by \
         moving what both sides need into a file below them):\n  {}",
        unexpected.len(),
        unexpected.join("\n  ")
    );
    let gone: Vec<&str> = NOT_YET_ONE_WAY
        .iter()
        .map(|(folder, _)| *folder)
        .filter(|folder| !loops.iter().any(|names| within(folder, names)))
        .collect();
    assert!(
        gone.is_empty(),
        "no loop is left in {gone:?}: take them out of NOT_YET_ONE_WAY so none comes back"
    );
}

/// The checker itself: a loop through a parent's re-export and a child's
/// `super::` use is found, and one-way imports are not reported.
#[test]
fn the_checker_finds_a_loop_and_only_a_loop() {
    let dir = tempdir();
    write(&dir, "lib.rs", "mod a;\nmod b;\npub use a::A;\n");
    write(
        &dir,
        "a/mod.rs",
        "mod inner;\npub struct A;\nuse inner::f;\n",
    );
    write(
        &dir,
        "a/inner.rs",
        "// use crate::b; in a comment is no edge\nconst S: &str = \"crate::b::B\";\n\
         pub fn f() { let _ = super::A; }\n",
    );
    write(
        &dir,
        "b.rs",
        "use crate::a::{self, A as Aa};\n#[cfg(test)]\nmod tests { use super::*; }\n",
    );
    let graph = ModuleGraph::read(&dir, "lib.rs");
    let cycles: Vec<Vec<String>> = graph
        .cycles()
        .into_iter()
        .map(|c| c.iter().map(|m| graph.files[m].clone()).collect())
        .collect();
    assert_eq!(
        cycles,
        vec![vec!["a/mod.rs".to_string(), "a/inner.rs".to_string()]]
    );
    assert!(graph.edges[&vec!["b".to_string()]].contains(&vec!["a".to_string()]));
    assert!(!graph.edges[&vec!["b".to_string()]].contains(&vec!["b".to_string()]));

    // One way only: the loop is gone.
    write(&dir, "a/mod.rs", "mod inner;\npub struct A;\n");
    assert!(ModuleGraph::read(&dir, "lib.rs").cycles().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The members list is found past comments that name it, over several lines.
#[test]
fn the_members_are_read_from_the_manifest() {
    let manifest = "# members of their own [sic]\n[workspace]\nmembers = [\".\", \"cli\",\n  \
                    \"local\", # the servers\n]\nresolver = \"2\"\n";
    assert_eq!(members(manifest), [".", "cli", "local"]);
}

type ModPath = Vec<String>;

struct ModuleGraph {
    /// Each file module and its file, relative to the source root.
    files: BTreeMap<ModPath, String>,
    edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

impl ModuleGraph {
    fn read(root: &Path, root_file: &str) -> ModuleGraph {
        let mut sources = BTreeMap::new();
        for file in rust_files(root) {
            let rel = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            // A package with both: the other crate's root is no module of this one.
            if rel != root_file && (rel == "lib.rs" || rel == "main.rs") {
                continue;
            }
            let module = module_of(&rel, root_file);
            let text = std::fs::read_to_string(&file).unwrap();
            sources.insert(module, (rel, text));
        }
        let files: BTreeMap<ModPath, String> = sources
            .iter()
            .map(|(m, (rel, _))| (m.clone(), rel.clone()))
            .collect();
        let mut edges = BTreeMap::new();
        for (module, (_, text)) in &sources {
            let mut targets = BTreeSet::new();
            for path in paths_in(&tokens(text), module, &files) {
                if let Some(target) = deepest_file(&path, &files) {
                    if &target != module {
                        targets.insert(target);
                    }
                }
            }
            edges.insert(module.clone(), targets);
        }
        ModuleGraph { files, edges }
    }

    /// The graph itself, then the graphs of folders: at level `k` a module
    /// deeper than `k` counts as its ancestor `k` deep, so `worker/` and
    /// `prometheus/` that import each other through any of their files are
    /// a loop too.
    fn levels(&self) -> Vec<ModuleGraph> {
        let deepest = self.files.keys().map(Vec::len).max().unwrap_or(0);
        let mut out = vec![self.collapsed(usize::MAX)];
        out.extend((1..deepest).map(|k| self.collapsed(k)));
        out
    }

    fn collapsed(&self, k: usize) -> ModuleGraph {
        let cut = |m: &ModPath| m[..m.len().min(k)].to_vec();
        let mut files = BTreeMap::new();
        for (m, rel) in &self.files {
            let node = cut(m);
            let name = if node.len() < m.len()
                || self
                    .files
                    .keys()
                    .any(|o| o.len() > k && cut(o) == node && o != m)
            {
                format!("{}/", node.join("/"))
            } else {
                rel.clone()
            };
            files.insert(node, name);
        }
        let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> =
            files.keys().map(|n| (n.clone(), BTreeSet::new())).collect();
        for (from, tos) in &self.edges {
            for to in tos {
                let (a, b) = (cut(from), cut(to));
                if a != b {
                    edges.get_mut(&a).unwrap().insert(b);
                }
            }
        }
        ModuleGraph { files, edges }
    }

    /// Loops through every strongly connected group of more than one
    /// module: shortest ones, until each member is on one.
    fn cycles(&self) -> Vec<Vec<ModPath>> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for start in self.files.keys() {
            if seen.contains(start) {
                continue;
            }
            let group = self.group_of(start);
            if group.len() < 2 {
                continue;
            }
            let mut covered = BTreeSet::new();
            for member in &group {
                if covered.contains(member) {
                    continue;
                }
                let cycle = self.shortest_loop(member, &group);
                covered.extend(cycle.iter().cloned());
                out.push(cycle);
            }
            seen.extend(group);
        }
        out
    }

    fn reachable(&self, from: &ModPath, forward: bool) -> BTreeSet<ModPath> {
        let mut seen = BTreeSet::from([from.clone()]);
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            let next: Vec<ModPath> = if forward {
                self.edges[&m].iter().cloned().collect()
            } else {
                self.edges
                    .iter()
                    .filter(|(_, to)| to.contains(&m))
                    .map(|(k, _)| k.clone())
                    .collect()
            };
            for n in next {
                if seen.insert(n.clone()) {
                    stack.push(n);
                }
            }
        }
        seen
    }

    fn group_of(&self, m: &ModPath) -> BTreeSet<ModPath> {
        let fwd = self.reachable(m, true);
        let back = self.reachable(m, false);
        fwd.intersection(&back).cloned().collect()
    }

    fn shortest_loop(&self, start: &ModPath, group: &BTreeSet<ModPath>) -> Vec<ModPath> {
        let mut prev: BTreeMap<ModPath, ModPath> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        while let Some(m) = queue.pop_front() {
            for n in &self.edges[&m] {
                if !group.contains(n) {
                    continue;
                }
                if n == start {
                    let mut path = vec![m.clone()];
                    while let Some(p) = prev.get(path.last().unwrap()) {
                        path.push(p.clone());
                    }
                    path.reverse();
                    return path;
                }
                if !prev.contains_key(n) {
                    prev.insert(n.clone(), m.clone());
                    queue.push_back(n.clone());
                }
            }
        }
        unreachable!("a strongly connected group has a loop through each member")
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

fn module_of(rel: &str, root_file: &str) -> ModPath {
    if rel == root_file {
        return Vec::new();
    }
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().map(String::as_str) == Some("mod") {
        parts.pop();
    }
    parts
}

fn deepest_file(path: &[String], files: &BTreeMap<ModPath, String>) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| files.contains_key(p))
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

/// The file's identifiers, `::` and punctuation, without comments, strings
/// and character literals.
fn tokens(text: &str) -> Vec<Tok> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
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
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('#') || next == Some('"'))
            && raw_string_end(&chars, i).is_some()
        {
            i = raw_string_end(&chars, i).unwrap();
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n') or a lifetime ('a): skip the former.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c == ':' && next == Some(':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// Where a raw string starting at `i` (`r"…"`, `r#"…"#`) ends, if it is one.
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let mut j = i + 1;
    let mut hashes = 0;
    while chars.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if chars.get(j) != Some(&'"')
        || (i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
    {
        return None;
    }
    j += 1;
    while j < chars.len() {
        if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(j)
}

/// Every module path the file names, made absolute. Inline `mod x { … }`
/// blocks are followed so that their `super::` means the file's module.
fn paths_in(
    toks: &[Tok],
    file_module: &ModPath,
    files: &BTreeMap<ModPath, String>,
) -> Vec<ModPath> {
    // The file's child modules (`mod x;`), which a path may start with.
    let children: BTreeSet<String> = files
        .keys()
        .filter(|k| k.len() == file_module.len() + 1 && k.starts_with(file_module))
        .map(|k| k.last().unwrap().clone())
        .collect();
    let mut out = Vec::new();
    // Names a `use` brought in (`use crate::pages;`), which a path may start with.
    let mut bound: BTreeMap<String, ModPath> = BTreeMap::new();
    // The inline modules we are in, each with the brace depth it opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let current: ModPath = file_module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(kw) if kw == "use" && !prev_is_path_sep(toks, i) => {
                let mut j = i + 1;
                let mut trees = Vec::new();
                use_tree(toks, &mut j, Vec::new(), &mut trees);
                for (raw, name) in trees {
                    let own_children = if inline.is_empty() {
                        &children
                    } else {
                        &BTreeSet::new()
                    };
                    if let Some(abs) = absolute(&raw, &current, own_children, &bound) {
                        // A later `name::…` path goes where this one does.
                        bound.insert(name, abs.clone());
                        out.push(abs);
                    }
                }
                i = j;
                continue;
            }
            Tok::Ident(first)
                if !prev_is_path_sep(toks, i) && toks.get(i + 1) == Some(&Tok::PathSep) =>
            {
                let mut raw = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::PathSep) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(seg)) => {
                            raw.push(seg.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                let own_children = if inline.is_empty() {
                    &children
                } else {
                    &BTreeSet::new()
                };
                if let Some(abs) = absolute(&raw, &current, own_children, &bound) {
                    out.push(abs);
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

fn prev_is_path_sep(toks: &[Tok], i: usize) -> bool {
    i > 0 && toks[i - 1] == Tok::PathSep
}

/// Reads one use tree at `*j` (`a::b::{c, d::e as f, *}`), pushing each
/// leaf path; stops after the tree (at `,`, `}` or `;`).
fn use_tree(
    toks: &[Tok],
    j: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    let mut path = prefix;
    let mut alias = None;
    loop {
        match toks.get(*j) {
            Some(Tok::Ident(seg)) if seg == "as" => {
                if let Some(Tok::Ident(name)) = toks.get(*j + 1) {
                    alias = Some(name.clone());
                }
                *j += 2;
            }
            Some(Tok::Ident(seg)) => {
                if seg != "self" || path.is_empty() {
                    path.push(seg.clone());
                }
                *j += 1;
            }
            Some(Tok::PathSep) => *j += 1,
            Some(Tok::Punct('*')) => *j += 1,
            Some(Tok::Punct('{')) => {
                *j += 1;
                loop {
                    use_tree(toks, j, path.clone(), out);
                    match toks.get(*j) {
                        Some(Tok::Punct(',')) => *j += 1,
                        Some(Tok::Punct('}')) => {
                            *j += 1;
                            break;
                        }
                        _ => return,
                    }
                    if toks.get(*j) == Some(&Tok::Punct('}')) {
                        *j += 1;
                        break;
                    }
                }
                if toks.get(*j) == Some(&Tok::Punct(';')) {
                    *j += 1;
                }
                return;
            }
            Some(Tok::Punct(';')) => {
                *j += 1;
                let name = alias.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
                out.push((path, name));
                return;
            }
            Some(Tok::Punct(',')) | Some(Tok::Punct('}')) | None => {
                let name = alias.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
                out.push((path, name));
                return;
            }
            Some(_) => *j += 1,
        }
    }
}

/// The path from the crate root, or `None` for a path outside the crate
/// (`std::…`, `shardq::…`) or to a local item.
fn absolute(
    raw: &[String],
    current: &ModPath,
    children: &BTreeSet<String>,
    bound: &BTreeMap<String, ModPath>,
) -> Option<ModPath> {
    let first = raw.first()?;
    let (mut base, rest): (ModPath, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &raw[1..]),
        "self" => (current.clone(), &raw[1..]),
        "super" => (current.clone(), raw),
        name if children.contains(name) => (current.clone(), raw),
        name if bound.contains_key(name) => (bound[name].clone(), &raw[1..]),
        _ => return None,
    };
    let mut rest = rest;
    while rest.first().map(String::as_str) == Some("super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}
