//! Every relative link in README.md, CHANGELOG.md and docs/*.md resolves
//! inside the repository: the file or folder it names exists, and an anchor
//! (`#…`) matches the GitHub slug of a heading in the Markdown file it points
//! at. Links with a scheme (`https:`, `mailto:`) are not followed. A path of
//! the repository named in a code span (`tests/pause.rs`) must exist too, so
//! that moving a file shows every page that still names its old place.
//!
//! Lives in the harness because that crate builds cheaply and needs nothing
//! here but `std`: no server, no Markdown crate.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

/// The repository root (the harness sits one level below it).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness lives inside the repository")
        .to_path_buf()
}

/// The documents whose links are checked, relative to the root.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs = vec![PathBuf::from("README.md"), PathBuf::from("CHANGELOG.md")];
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("read docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            path.strip_prefix(root)
                .expect("under the root")
                .to_path_buf()
        })
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// A link found in a document: its line (1-based) and its target as written.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// Lines outside fenced code blocks, with their 1-based numbers; a line of a
/// fence is replaced by an empty one so that paragraphs still split there.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                out.push((i + 1, ""));
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                out.push((i + 1, ""));
            }
            (Some(_), _) => out.push((i + 1, "")),
            (None, None) => out.push((i + 1, line)),
        }
    }
    out
}

/// A code span: the characters `start..end` of a text, backticks included,
/// and what it holds.
struct CodeSpan {
    start: usize,
    end: usize,
    content: String,
}

/// The code spans of a paragraph. An opening run of backticks without a
/// closing run of the same length is literal.
fn code_spans(chars: &[char]) -> Vec<CodeSpan> {
    let run_at = |i: usize| chars[i..].iter().take_while(|c| **c == '`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let open = run_at(i);
        let mut j = i + open;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let run = run_at(j);
                if run == open {
                    close = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                spans.push(CodeSpan {
                    start: i,
                    end: end + open,
                    content: chars[i + open..end].iter().collect(),
                });
                i = end + open;
            }
            None => i += open,
        }
    }
    spans
}

/// `text` with its code spans blanked out (newlines kept), so that a link
/// written inside backticks is not taken for one.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    for span in code_spans(&chars) {
        for c in &mut out[span.start..span.end] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    }
    out.into_iter().collect()
}

/// The folders at the repository's root: a code span that starts with one of
/// them names a file of the repository (`tests/pause.rs`, `src/worker/`).
const REPO_FOLDERS: &[&str] = &[
    ".ci/",
    "bench/",
    "cli/",
    "dashboard/",
    "docs/",
    "examples/",
    "harness/",
    "migrations/",
    "scripts/",
    "src/",
    "tests/",
];

/// Repository paths named in code spans, relative to the root, with their
/// lines: `src/router.rs`, `tests/plans.rs` (of `tests/plans.rs::a_test`).
/// Spans with spaces, globs or placeholders are not paths.
fn code_paths(text: &str) -> Vec<Link> {
    let lines = prose_lines(text);
    let mut found = Vec::new();
    for paragraph in lines.split(|(_, line)| line.trim().is_empty()) {
        let Some(&(first_line, _)) = paragraph.first() else {
            continue;
        };
        let joined: Vec<&str> = paragraph.iter().map(|(_, line)| *line).collect();
        let chars: Vec<char> = joined.join("\n").chars().collect();
        for span in code_spans(&chars) {
            let content = span.content.trim();
            let path = content.split("::").next().unwrap_or(content);
            let is_path = REPO_FOLDERS.iter().any(|folder| path.starts_with(folder))
                && !path.contains(|c: char| c.is_whitespace() || "*<>{}…|".contains(c));
            if is_path {
                found.push(Link {
                    line: first_line + chars[..span.start].iter().filter(|c| **c == '\n').count(),
                    target: path.to_string(),
                });
            }
        }
    }
    found
}

/// The link targets of a document: inline links and images `[..](target)`,
/// reference definitions `[label]: target`, and `href="…"` / `src="…"` of
/// HTML tags, outside code blocks and code spans.
fn links(text: &str) -> Vec<Link> {
    let lines = prose_lines(text);
    let mut found = Vec::new();
    // Paragraphs: a code span may cross lines, never a blank line.
    for paragraph in lines.split(|(_, line)| line.trim().is_empty()) {
        let Some(&(first_line, _)) = paragraph.first() else {
            continue;
        };
        let joined: Vec<&str> = paragraph.iter().map(|(_, line)| *line).collect();
        let prose = without_code_spans(&joined.join("\n"));
        let line_of = |offset: usize| first_line + prose[..offset].matches('\n').count();
        let mut from = 0;
        while let Some(at) = prose[from..].find("](") {
            let start = from + at + 2;
            let rest = &prose[start..];
            let end = closing_paren(rest).unwrap_or(rest.len());
            let target = link_destination(&rest[..end]);
            if !target.is_empty() {
                found.push(Link {
                    line: line_of(start),
                    target,
                });
            }
            from = start + end;
        }
        for (offset, line) in line_offsets(&prose) {
            if let Some(target) = reference_definition(line) {
                found.push(Link {
                    line: line_of(offset),
                    target,
                });
            }
        }
        for attr in ["href=\"", "src=\""] {
            let mut from = 0;
            while let Some(at) = prose[from..].find(attr) {
                let start = from + at + attr.len();
                let end = prose[start..].find('"').map_or(prose.len(), |e| start + e);
                found.push(Link {
                    line: line_of(start),
                    target: prose[start..end].to_string(),
                });
                from = end;
            }
        }
    }
    found.sort_by_key(|link| link.line);
    found
}

/// Each line of `text` with the byte offset it starts at.
fn line_offsets(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    text.split('\n').map(move |line| {
        let start = offset;
        offset += line.len() + 1;
        (start, line)
    })
}

/// Where the `)` that closes a link destination is (balanced parentheses).
fn closing_paren(rest: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            '\n' => return None,
            _ => {}
        }
    }
    None
}

/// The destination of `(dest "title")` or `(<dest>)`.
fn link_destination(inside: &str) -> String {
    let inside = inside.trim();
    if let Some(stripped) = inside.strip_prefix('<') {
        return stripped.split('>').next().unwrap_or("").to_string();
    }
    inside.split_whitespace().next().unwrap_or("").to_string()
}

/// The target of a reference definition line, `[label]: target`.
fn reference_definition(line: &str) -> Option<String> {
    let line = line.trim_start();
    let rest = line.strip_prefix('[')?;
    let close = rest.find("]:")?;
    if close == 0 || rest[..close].contains(']') {
        return None;
    }
    let target = link_destination(&rest[close + 2..]);
    (!target.is_empty()).then_some(target)
}

/// The anchors GitHub gives the headings of a document (`# Title` → `title`;
/// a repeated slug gets `-1`, `-2`, …).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !trimmed[hashes..].starts_with([' ', '\t']) {
            continue;
        }
        let title = trimmed[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(title);
        let mut candidate = base.clone();
        let mut n = 0;
        while !seen.insert(candidate.clone()) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
    }
    seen
}

/// GitHub's heading slug: the heading's text (a link's label, not its
/// destination), lowercased; letters, digits, `-` and `_` kept, spaces turned
/// into `-`, everything else dropped.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[label](destination)` → `label`.
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let label_end = open + mid;
        let Some(close) = closing_paren(&rest[label_end + 2..]) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..label_end]);
        rest = &rest[label_end + 2 + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// `%20` and the like decoded; anything malformed kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// `path` with `.` and `..` resolved lexically; `None` when it climbs above
/// its start.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// What is wrong with the links of document `doc` (relative to the root),
/// whose text is `text`: one line per broken link. `read` gives the text of
/// another document (relative to the root) and `exists` whether a path does.
fn problems(
    doc: &Path,
    text: &str,
    read: &dyn Fn(&Path) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for Link { line, target } in code_paths(text) {
        let exists_there = normalize(Path::new(&target)).is_some_and(|path| exists(&path));
        if !exists_there {
            out.push(format!(
                "{}:{line}: `{target}`: names a repository path that does not exist",
                doc.display()
            ));
        }
    }
    let here = doc.parent().unwrap_or(Path::new(""));
    for Link { line, target } in links(text) {
        let at = format!("{}:{line}: `{target}`", doc.display());
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            Some(doc.to_path_buf())
        } else if path.starts_with('/') {
            out.push(format!(
                "{at}: an absolute path; write it relative to {}",
                doc.display()
            ));
            continue;
        } else {
            normalize(&here.join(percent_decode(path)))
        };
        let Some(resolved) = resolved else {
            out.push(format!("{at}: points outside the repository"));
            continue;
        };
        if !exists(&resolved) {
            out.push(format!(
                "{at}: {} does not exist in the repository",
                resolved.display()
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if resolved.extension().is_none_or(|ext| ext != "md") {
            continue;
        }
        let Some(target_text) = read(&resolved) else {
            out.push(format!("{at}: cannot read {}", resolved.display()));
            continue;
        };
        if !anchors(&target_text).contains(&percent_decode(anchor).to_lowercase()) {
            out.push(format!(
                "{at}: no heading of {} has the anchor `#{anchor}`",
                resolved.display()
            ));
        }
    }
    out
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo_root();
    let read = |path: &Path| std::fs::read_to_string(root.join(path)).ok();
    let exists = |path: &Path| root.join(path).exists();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = read(&doc).unwrap_or_else(|| panic!("read {}", doc.display()));
        checked += links(&text).len();
        broken.extend(problems(&doc, &text, &read, &exists));
    }
    assert!(checked > 0, "no link found: the parser is broken");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_missing_file_anchor_or_named_path_and_an_escape_are_reported() {
    let docs = [
        (
            "docs/a.md",
            "# Top\n\n## Behind PgBouncer\n\nSee [b](b.md#second-part), [top](#top),\n\
             [the pooler](#behind-pgbouncer) and [root](../README.md).\n\
             Broken: [gone](missing.md), [no anchor](b.md#nowhere),\n\
             [out](../../etc/passwd), [self](#no-such-heading).\n\
             `[in code](not-a-link.md)` and a [web link](https://example.com/x).\n\
             Paths: `src/missing.rs`, `tests/plans.rs::a_test`, `src/*.rs`, `cargo test`.\n\n\
             ```text\n[in a block](nope.md)\n```\n\n[ref]: gone-too.md\n",
        ),
        ("docs/b.md", "# First\n\n## Second part\n"),
        ("README.md", "# Readme\n"),
        ("tests/plans.rs", ""),
    ];
    let read = |path: &Path| {
        docs.iter()
            .find(|(name, _)| Path::new(name) == path)
            .map(|(_, text)| text.to_string())
    };
    let exists = |path: &Path| read(path).is_some() || path == Path::new("docs");
    let found = problems(Path::new("docs/a.md"), docs[0].1, &read, &exists);
    let expected = [
        "docs/a.md:10: `src/missing.rs`: names a repository path that does not exist",
        "docs/a.md:7: `missing.md`: docs/missing.md does not exist in the repository",
        "docs/a.md:7: `b.md#nowhere`: no heading of docs/b.md has the anchor `#nowhere`",
        "docs/a.md:8: `../../etc/passwd`: points outside the repository",
        "docs/a.md:8: `#no-such-heading`: no heading of docs/a.md has the anchor `#no-such-heading`",
        "docs/a.md:16: `gone-too.md`: docs/gone-too.md does not exist in the repository",
    ];
    assert_eq!(found, expected);
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Behind PgBouncer"), "behind-pgbouncer");
    assert_eq!(
        slug("`shardq check` and a sick shard"),
        "shardq-check-and-a-sick-shard"
    );
    assert_eq!(
        slug("Pipeline vs serial (one shard)"),
        "pipeline-vs-serial-one-shard"
    );
    assert_eq!(slug("Keys: `worker.*`"), "keys-worker");
    assert_eq!(slug("A [linked](x.md#y) title"), "a-linked-title");
    assert_eq!(
        slug("dequeue.claim_budget_max_ms"),
        "dequeueclaim_budget_max_ms"
    );
    let twice = anchors("# Notes\n\n## Notes\n\n```text\n# not a heading\n```\n");
    assert_eq!(
        twice,
        HashSet::from(["notes".to_string(), "notes-1".to_string()])
    );
}
