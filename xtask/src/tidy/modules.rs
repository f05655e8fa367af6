//! The rule "no cycle between modules inside a crate".
//!
//! Each `.rs` file under a member's `src/` is a module (`lib.rs` and `main.rs` are the root,
//! `a.rs` and `a/mod.rs` are `a`, `a/b.rs` is `a::b`); `src/bin/` is skipped, each of its files
//! being a crate root of its own that declares no module files here. A file names the modules
//! of its crate in `use` declarations and in paths that start with `crate::`, `super::` or
//! `self::` (comments, string literals and `#[cfg(test)]` modules do not count). The module a
//! path names is the longest prefix of it that is a module file, and `M -> T` is an edge when
//! neither module is an ancestor of the other (a parent using its child and a child its parent
//! is how Rust modules work). Every strongly connected component of more than one module is
//! reported, with one cycle through it and the lines that make its edges.

use std::{
    collections::{btree_map::Entry, BTreeMap, BTreeSet, VecDeque},
    fs,
    path::Path,
};

use super::{collect_rs, member_dirs, rel};

/// A module path inside a crate: `[]` is the root, `["a", "b"]` is `a::b`.
type ModPath = Vec<String>;

/// Where an edge comes from: a file (relative to `src/`) and a line of it.
type Evidence = Vec<(String, usize)>;

/// The edges of a crate's module graph, each with the lines that make it.
type Edges = BTreeMap<(ModPath, ModPath), Evidence>;

/// Reports every cycle between the modules of a workspace member.
pub(super) fn check_module_cycles(root: &Path, problems: &mut Vec<String>) {
    for dir in member_dirs(root) {
        let src = dir.join("src");
        let mut paths = Vec::new();
        collect_rs(&src, &mut paths);
        // A file that cannot be read is reported by the source rules.
        let files: BTreeMap<String, String> = paths
            .iter()
            .filter_map(|path| Some((rel(&src, path), fs::read_to_string(path).ok()?)))
            .collect();
        let crate_dir = rel(root, &dir);
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| crate_dir.clone());
        for cycle in crate_cycles(&files) {
            problems.push(cycle.report(&crate_dir, &name));
        }
    }
}

/// One cycle of a strongly connected component of a crate's module graph.
#[derive(Debug)]
struct Cycle {
    /// The modules in order, the first one again at the end.
    path: Vec<ModPath>,
    /// The file of the first module, relative to `src/`.
    file: String,
    /// Each edge of `path` with the lines that make it.
    edges: Vec<(ModPath, ModPath, Evidence)>,
    /// The other modules of the component, which `path` does not go through.
    others: Vec<ModPath>,
}

impl Cycle {
    fn report(&self, crate_dir: &str, name: &str) -> String {
        let path: Vec<String> = self.path.iter().map(|m| show(m)).collect();
        let edges: Vec<String> = self
            .edges
            .iter()
            .map(|(from, to, evidence)| {
                let lines: Vec<String> = evidence
                    .iter()
                    .map(|(file, line)| format!("{crate_dir}/src/{file}:{line}"))
                    .collect();
                format!("{} -> {}: {}", show(from), show(to), lines.join(", "))
            })
            .collect();
        let mut text = format!(
            "{crate_dir}/src/{}: modules of {name} form a cycle: {} ({})",
            self.file,
            path.join(" -> "),
            edges.join("; ")
        );
        if !self.others.is_empty() {
            let others: Vec<String> = self.others.iter().map(|m| show(m)).collect();
            text.push_str(&format!("; the component also holds {}", others.join(", ")));
        }
        text
    }
}

fn show(module: &[String]) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// The module a file under `src/` is, or `None` for `src/bin/` and what is not Rust.
fn module_of(file: &str) -> Option<ModPath> {
    let stem = file.strip_suffix(".rs")?;
    if stem.starts_with("bin/") {
        return None;
    }
    let mut parts: ModPath = stem.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    Some(parts)
}

/// The cycles between the modules of one crate, given its files under `src/` (path relative to
/// `src/` → text), in a stable order.
fn crate_cycles(files: &BTreeMap<String, String>) -> Vec<Cycle> {
    let scans: Vec<(&str, ModPath, Scan)> = files
        .iter()
        .filter_map(|(file, text)| {
            let module = module_of(file)?;
            let scan = scan(&module, text);
            Some((file.as_str(), module, scan))
        })
        .collect();
    let mut tests: BTreeSet<ModPath> = BTreeSet::new();
    for (_, module, scan) in &scans {
        tests.extend(scan.test_modules.iter().cloned());
        if scan.test_file {
            tests.insert(module.clone());
        }
    }
    let is_test = |m: &ModPath| tests.iter().any(|t| m.starts_with(t));
    // The module → its file (`lib.rs` before `main.rs` for the root).
    let mut modules: BTreeMap<ModPath, String> = BTreeMap::new();
    for (file, module, _) in scans.iter().filter(|(_, m, _)| !is_test(m)) {
        modules
            .entry(module.clone())
            .or_insert_with(|| (*file).to_owned());
    }
    let mut edges = Edges::new();
    for (file, module, scan) in scans.iter().filter(|(_, m, _)| !is_test(m)) {
        for (path, line) in &scan.named {
            let target = (0..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|prefix| modules.contains_key(*prefix))
                .unwrap_or_default();
            if target.starts_with(module) || module.starts_with(target) {
                continue;
            }
            let evidence = edges.entry((module.clone(), target.to_vec())).or_default();
            if !evidence.contains(&((*file).to_owned(), *line)) {
                evidence.push(((*file).to_owned(), *line));
            }
        }
    }
    cycles(&modules, &edges)
}

/// One cycle for each strongly connected component of more than one module.
fn cycles(modules: &BTreeMap<ModPath, String>, edges: &Edges) -> Vec<Cycle> {
    let nodes: Vec<&ModPath> = modules.keys().collect();
    let index: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut adj = vec![Vec::new(); nodes.len()];
    for (from, to) in edges.keys() {
        if let (Some(&f), Some(&t)) = (index.get(from), index.get(to)) {
            adj[f].push(t);
        }
    }
    for succ in &mut adj {
        succ.sort_unstable();
        succ.dedup();
    }
    let mut found = Vec::new();
    for mut component in components(&adj) {
        if component.len() < 2 {
            continue;
        }
        component.sort_unstable();
        let inside: BTreeSet<usize> = component.iter().copied().collect();
        let start = component[0];
        let Some(path) = shortest_cycle(&adj, &inside, start) else {
            continue;
        };
        let on_path: BTreeSet<usize> = path.iter().copied().collect();
        let path: Vec<ModPath> = path.iter().map(|&i| nodes[i].clone()).collect();
        let edges = path
            .windows(2)
            .map(|pair| {
                let key = (pair[0].clone(), pair[1].clone());
                let evidence = edges.get(&key).cloned().unwrap_or_default();
                (key.0, key.1, evidence)
            })
            .collect();
        found.push(Cycle {
            file: modules.get(nodes[start]).cloned().unwrap_or_default(),
            path,
            edges,
            others: component
                .iter()
                .filter(|i| !on_path.contains(i))
                .map(|&i| nodes[i].clone())
                .collect(),
        });
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    found
}

/// The strongly connected components of a graph (Tarjan's algorithm).
fn components(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct Tarjan<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.next);
            self.low[v] = self.next;
            self.next += 1;
            self.stack.push(v);
            self.on_stack[v] = true;
            for &w in &self.adj[v] {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                self.found.push(component);
            }
        }
    }
    let n = adj.len();
    let mut tarjan = Tarjan {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if tarjan.index[v].is_none() {
            tarjan.visit(v);
        }
    }
    tarjan.found
}

/// The shortest cycle from `start` back to it inside a component (breadth first, successors
/// in order), as its nodes with `start` at both ends.
fn shortest_cycle(
    adj: &[Vec<usize>],
    inside: &BTreeSet<usize>,
    start: usize,
) -> Option<Vec<usize>> {
    let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in adj[v].iter().filter(|w| inside.contains(w)) {
            if w == start {
                let mut path = vec![v];
                let mut at = v;
                while let Some(&p) = parent.get(&at) {
                    path.push(p);
                    at = p;
                }
                path.reverse();
                path.push(start);
                return Some(path);
            }
            if let Entry::Vacant(slot) = parent.entry(w) {
                slot.insert(v);
                queue.push_back(w);
            }
        }
    }
    None
}

/// What one file names and which of its modules are test modules.
#[derive(Debug, Default)]
struct Scan {
    /// The crate paths the file's code names, resolved (`crate::`, `super::`, `self::` made
    /// absolute), each with its line.
    named: Vec<(ModPath, usize)>,
    /// Modules declared `#[cfg(test)] mod name;` in the file.
    test_modules: Vec<ModPath>,
    /// The file is `#![cfg(test)]`.
    test_file: bool,
}

/// Reads the paths a file of module `module` names.
fn scan(module: &ModPath, text: &str) -> Scan {
    let toks = tokenize(text);
    let mut scan = Scan::default();
    let mut depth = 0usize;
    // Inline modules (`mod name { … }`) the scan is in, with the depth inside their braces.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let current = |inline: &[(String, usize)]| -> ModPath {
        module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(name, _)| name.clone()))
            .collect()
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].tok {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Punct('#') => {
                let Some((end, inner)) = cfg_test_attr(&toks, i) else {
                    i += 1;
                    continue;
                };
                if inner && depth == 0 {
                    scan.test_file = true;
                    return scan;
                }
                i = end;
                let j = skip_attrs_and_vis(&toks, end);
                if let (Some(Tok::Ident(kw)), Some(Tok::Ident(name))) =
                    (tok(&toks, j), tok(&toks, j + 1))
                {
                    if kw == "mod" {
                        match tok(&toks, j + 2) {
                            Some(Tok::Punct(';')) => {
                                let mut path = current(&inline);
                                path.push(name.clone());
                                scan.test_modules.push(path);
                                i = j + 3;
                            }
                            Some(Tok::Punct('{')) => i = matching_close(&toks, j + 2) + 1,
                            _ => {}
                        }
                    }
                }
            }
            Tok::Ident(kw) if kw == "mod" => match (tok(&toks, i + 1), tok(&toks, i + 2)) {
                (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) if !name.starts_with('$') => {
                    depth += 1;
                    inline.push((name.clone(), depth));
                    i += 3;
                }
                _ => i += 1,
            },
            Tok::Ident(kw) if kw == "use" && tok(&toks, i + 1) != Some(&Tok::Punct('<')) => {
                let mut raw = Vec::new();
                i = use_tree(&toks, i + 1, &[], &mut raw);
                while i < toks.len() && toks[i].tok != Tok::Punct(';') {
                    i += 1;
                }
                let here = current(&inline);
                scan.named.extend(
                    raw.into_iter()
                        .filter_map(|(segs, line)| Some((resolve(&here, &segs)?, line))),
                );
            }
            Tok::Ident(kw)
                if matches!(kw.as_str(), "crate" | "super" | "self")
                    && tok(&toks, i + 1) == Some(&Tok::Sep)
                    && (i == 0 || toks[i - 1].tok != Tok::Sep) =>
            {
                let line = toks[i].line;
                let mut segs = Vec::new();
                while let Some(Tok::Ident(seg)) = tok(&toks, i) {
                    segs.push(seg.clone());
                    i += 1;
                    let more = tok(&toks, i) == Some(&Tok::Sep)
                        && matches!(tok(&toks, i + 1), Some(Tok::Ident(_)));
                    if !more {
                        break;
                    }
                    i += 1;
                }
                if let Some(path) = resolve(&current(&inline), &segs) {
                    scan.named.push((path, line));
                }
            }
            _ => i += 1,
        }
    }
    scan
}

/// The paths of a use tree starting at `i`, each under `prefix`, unresolved, with the line of
/// its last segment; returns the index after the tree.
fn use_tree(
    toks: &[Token],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, usize)>,
) -> usize {
    let mut segs = prefix.to_vec();
    if tok(toks, i) == Some(&Tok::Sep) {
        // `::name` is another crate: no keyword starts the path, so it resolves to nothing.
        segs.push("::".to_owned());
        i += 1;
    }
    let mut line = toks.get(i).map_or(0, |t| t.line);
    loop {
        match tok(toks, i) {
            Some(Tok::Ident(seg)) => {
                // `a::{self}` is `a` itself; a leading `self` is resolved later.
                if seg != "self" || segs.is_empty() {
                    segs.push(seg.clone());
                }
                line = toks[i].line;
                i += 1;
                if tok(toks, i) == Some(&Tok::Sep) {
                    i += 1;
                    continue;
                }
                if tok(toks, i) == Some(&Tok::Ident("as".to_owned())) {
                    i += 2;
                }
                out.push((segs, line));
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push((segs, line));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match tok(toks, i) {
                        None => return i,
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        Some(_) => {
                            let next = use_tree(toks, i, &segs, out);
                            i = if next == i { i + 1 } else { next };
                        }
                    }
                }
            }
            _ => return i,
        }
    }
}

/// A path that starts with `crate`, `super` or `self`, made absolute from module `here`;
/// `None` for any other path (another crate, or a name in scope) and for one that leaves the
/// crate.
fn resolve(here: &ModPath, segs: &[String]) -> Option<ModPath> {
    let (first, rest) = segs.split_first()?;
    let mut path = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.clone(),
        "super" => {
            let mut path = here.clone();
            path.pop()?;
            path
        }
        _ => return None,
    };
    for seg in rest {
        match seg.as_str() {
            "super" => {
                path.pop()?;
            }
            "self" => {}
            "crate" => return None,
            _ => path.push(seg.clone()),
        }
    }
    Some(path)
}

fn tok(toks: &[Token], i: usize) -> Option<&Tok> {
    toks.get(i).map(|t| &t.tok)
}

/// If an attribute `#[cfg(test)]` (or `#![cfg(test)]`) starts at `i`: the index after it and
/// whether it is an inner one.
fn cfg_test_attr(toks: &[Token], i: usize) -> Option<(usize, bool)> {
    let inner = tok(toks, i + 1) == Some(&Tok::Punct('!'));
    let at = if inner { i + 2 } else { i + 1 };
    let expected = [
        Tok::Punct('['),
        Tok::Ident("cfg".to_owned()),
        Tok::Punct('('),
        Tok::Ident("test".to_owned()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let matches = expected
        .iter()
        .enumerate()
        .all(|(k, want)| tok(toks, at + k) == Some(want));
    matches.then_some((at + expected.len(), inner))
}

/// The index after any outer attributes and a visibility (`pub`, `pub(crate)`) from `i`.
fn skip_attrs_and_vis(toks: &[Token], mut i: usize) -> usize {
    while tok(toks, i) == Some(&Tok::Punct('#')) && tok(toks, i + 1) == Some(&Tok::Punct('[')) {
        i = matching_close(toks, i + 1) + 1;
    }
    if tok(toks, i) == Some(&Tok::Ident("pub".to_owned())) {
        i += 1;
        if tok(toks, i) == Some(&Tok::Punct('(')) {
            i = matching_close(toks, i) + 1;
        }
    }
    i
}

/// The index of the bracket that closes the one at `open` (`(`, `[` or `{`), or the last token.
fn matching_close(toks: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    toks.len().saturating_sub(1)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// An identifier or keyword (`$crate` is `crate`, another `$name` keeps its `$`).
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    /// A string, character or number literal, or a lifetime.
    Lit,
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The tokens of Rust source, without comments and with each literal as one `Lit`.
fn tokenize(text: &str) -> Vec<Token> {
    let s: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        let start_line = line;
        let tok = if c == '\n' {
            line += 1;
            i += 1;
            continue;
        } else if c.is_whitespace() {
            i += 1;
            continue;
        } else if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
            continue;
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&s, i, &mut line);
            continue;
        } else if c == '"' {
            i = skip_quoted(&s, i + 1, '"', &mut line);
            Tok::Lit
        } else if c == '\'' {
            if next == Some('\\') {
                i = skip_quoted(&s, i + 1, '\'', &mut line);
            } else if s.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                // A lifetime or a label.
                i += 1;
                while i < s.len() && is_ident_continue(s[i]) {
                    i += 1;
                }
            }
            Tok::Lit
        } else if c.is_ascii_digit() {
            while i < s.len() && is_ident_continue(s[i]) {
                i += 1;
            }
            Tok::Lit
        } else if c == ':' && next == Some(':') {
            i += 2;
            Tok::Sep
        } else if c == '$' && next.is_some_and(is_ident_start) {
            let (word, end) = ident_at(&s, i + 1);
            i = end;
            Tok::Ident(if word == "crate" {
                word
            } else {
                format!("${word}")
            })
        } else if is_ident_start(c) {
            let (word, end) = ident_at(&s, i);
            i = end;
            match literal_after_prefix(&s, &word, i, &mut line) {
                Some((end, tok)) => {
                    i = end;
                    tok
                }
                None => Tok::Ident(word),
            }
        } else {
            i += 1;
            Tok::Punct(c)
        };
        out.push(Token {
            tok,
            line: start_line,
        });
    }
    out
}

/// The identifier starting at `i` and the index after it.
fn ident_at(s: &[char], mut i: usize) -> (String, usize) {
    let start = i;
    while i < s.len() && is_ident_continue(s[i]) {
        i += 1;
    }
    (s[start..i].iter().collect(), i)
}

/// After an identifier `word` that ends at `i`: a raw string (`r"…"`, `br#"…"#`), a byte or C
/// string (`b"…"`, `c"…"`), a byte (`b'x'`) or a raw identifier (`r#type`), as the index after
/// it and its token.
fn literal_after_prefix(
    s: &[char],
    word: &str,
    i: usize,
    line: &mut usize,
) -> Option<(usize, Tok)> {
    let at = s.get(i).copied();
    match (word, at) {
        ("r" | "br" | "cr", Some('"' | '#')) => {
            let mut j = i;
            while s.get(j) == Some(&'#') {
                j += 1;
            }
            let hashes = j - i;
            if s.get(j) == Some(&'"') {
                return Some((skip_raw(s, j + 1, hashes, line), Tok::Lit));
            }
            if word == "r" && hashes == 1 && s.get(j).is_some_and(|c| is_ident_start(*c)) {
                let (name, end) = ident_at(s, j);
                return Some((end, Tok::Ident(name)));
            }
            None
        }
        ("b" | "c", Some('"')) => Some((skip_quoted(s, i + 1, '"', line), Tok::Lit)),
        ("b", Some('\'')) => Some((skip_quoted(s, i + 1, '\'', line), Tok::Lit)),
        _ => None,
    }
}

/// The index after a literal whose opening quote is just before `i`.
fn skip_quoted(s: &[char], mut i: usize, quote: char, line: &mut usize) -> usize {
    while i < s.len() {
        match s[i] {
            '\\' => {
                if s.get(i + 1) == Some(&'\n') {
                    *line += 1;
                }
                i += 2;
            }
            c if c == quote => return i + 1,
            c => {
                if c == '\n' {
                    *line += 1;
                }
                i += 1;
            }
        }
    }
    s.len()
}

/// The index after a raw string whose opening quote is just before `i`, closed by `"` and
/// `hashes` `#`.
fn skip_raw(s: &[char], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while i < s.len() {
        if s[i] == '"' && (1..=hashes).all(|k| s.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        if s[i] == '\n' {
            *line += 1;
        }
        i += 1;
    }
    s.len()
}

/// The index after a (nested) block comment starting at `i`.
fn skip_block_comment(s: &[char], mut i: usize, line: &mut usize) -> usize {
    let mut depth = 0usize;
    while i < s.len() {
        if s[i] == '/' && s.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            if s[i] == '\n' {
                *line += 1;
            }
            i += 1;
        }
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: &str) -> ModPath {
        if path.is_empty() || path == "crate" {
            Vec::new()
        } else {
            path.split("::").map(str::to_owned).collect()
        }
    }

    /// What `text`, the file of module `module`, names, as `path@line`.
    fn named(module: &str, text: &str) -> Vec<String> {
        scan(&m(module), text)
            .named
            .iter()
            .map(|(path, line)| format!("{}@{line}", show(path)))
            .collect()
    }

    fn files(list: &[(&str, &str)]) -> BTreeMap<String, String> {
        list.iter()
            .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
            .collect()
    }

    fn cycle_paths(list: &[(&str, &str)]) -> Vec<String> {
        crate_cycles(&files(list))
            .iter()
            .map(|c| {
                c.path
                    .iter()
                    .map(|p| show(p))
                    .collect::<Vec<_>>()
                    .join(" -> ")
            })
            .collect()
    }

    #[test]
    fn modules_use_trees_expand_braces_nesting_self_and_renames() {
        let text = "use super::{a::{b, c as d}, e};\n\
                    pub(crate) use crate::x::{self, y::{self as z}};\n\
                    use super::*;\n\
                    use std::fmt;\nuse ::other::thing;\nuse local::Child;\n\
                    pub(super) use self::child::Item;\n";
        assert_eq!(
            named("p::q", text),
            [
                "p::a::b@1",
                "p::a::c@1",
                "p::e@1",
                "x@2",
                "x::y@2",
                "p@3",
                "p::q::child::Item@7"
            ]
        );
        let multi = "use crate::{\n    a::One,\n    b::{\n        Two,\n    },\n};\n";
        assert_eq!(named("m", multi), ["a::One@2", "b::Two@4"]);
    }

    #[test]
    fn modules_inline_paths_count_and_comments_strings_and_tests_do_not() {
        let text = r##"//! Uses `crate::doc::Thing` in prose.
/* crate::block /* nested crate::x */ still a comment */
fn f<'a>(x: &'a str) -> char {
    let _ = "crate::in_string";
    let _ = r#"super::raw "quoted" crate::raw"#;
    let _ = b"self::bytes";
    let _ = '"';
    let _ = crate::real::call::<u8>(x);
    let _ = super::super::up::Value;
    let _ = <self::own::Ty as Tr>::X;
    $crate::macro_path!();
    'x'
}
#[cfg(test)]
mod tests {
    use crate::only_tests::A;
    fn g() { let _ = crate::also_tests::B; }
}
#[cfg(test)]
#[allow(dead_code)]
pub(crate) mod helpers;
mod inline {
    use super::sibling::X;
    fn h() { let _ = self::deep::Y; }
}
fn after() -> u8 { crate::after::f() }
"##;
        let got = named("a::b", text);
        assert_eq!(
            got,
            [
                "real::call@8",
                "up::Value@9",
                "a::b::own::Ty@10",
                "macro_path@11",
                "a::b::sibling::X@23",
                "a::b::inline::deep::Y@24",
                "after::f@26"
            ]
        );
        assert_eq!(scan(&m("a::b"), text).test_modules, [m("a::b::helpers")]);
        assert!(scan(&m("a"), "#![cfg(test)]\nuse crate::x;\n").test_file);
    }

    #[test]
    fn modules_file_paths_map_to_module_paths() {
        assert_eq!(module_of("lib.rs"), Some(m("")));
        assert_eq!(module_of("main.rs"), Some(m("")));
        assert_eq!(module_of("a.rs"), Some(m("a")));
        assert_eq!(module_of("a/mod.rs"), Some(m("a")));
        assert_eq!(module_of("a/b.rs"), Some(m("a::b")));
        assert_eq!(module_of("a/b/mod.rs"), Some(m("a::b")));
        assert_eq!(module_of("bin/tool.rs"), None);
        assert_eq!(module_of("a/notes.md"), None);
    }

    #[test]
    fn modules_super_and_self_resolve_the_same_for_mod_rs_and_plain_files() {
        let text = "use super::x;\nuse self::y;\nuse super::super::z;\n";
        let plain = scan(&module_of("a/b.rs").unwrap(), text);
        let dir = scan(&module_of("a/b/mod.rs").unwrap(), text);
        let shown = |s: &Scan| s.named.iter().map(|(p, _)| show(p)).collect::<Vec<_>>();
        assert_eq!(shown(&plain), ["a::x", "a::b::y", "z"]);
        assert_eq!(shown(&plain), shown(&dir));
        // `super` at the root leaves the crate.
        assert!(named("", "use super::x;\n").is_empty());
    }

    #[test]
    fn modules_target_is_the_longest_prefix_that_is_a_module_file() {
        let list = [
            ("lib.rs", ""),
            ("a/mod.rs", ""),
            (
                "a/b.rs",
                "use crate::c::d::Item;\nfn f() { crate::c::Thing::new(); }\n",
            ),
            ("c/mod.rs", ""),
            ("c/d.rs", "use crate::a::b::f;\n"),
        ];
        let scans = crate_cycles(&files(&list));
        assert_eq!(scans.len(), 1);
        let cycle = &scans[0];
        assert_eq!(cycle.path, [m("a::b"), m("c::d"), m("a::b")]);
        assert_eq!(cycle.file, "a/b.rs");
        assert_eq!(
            cycle.report("krate", "krate"),
            "krate/src/a/b.rs: modules of krate form a cycle: a::b -> c::d -> a::b \
             (a::b -> c::d: krate/src/a/b.rs:1; c::d -> a::b: krate/src/c/d.rs:1)"
        );
    }

    #[test]
    fn modules_parents_and_children_are_no_cycle() {
        let list = [
            ("lib.rs", "mod a;\nuse crate::a::b::Deep;\n"),
            (
                "a/mod.rs",
                "mod b;\nuse self::b::Thing;\nuse crate::a::b::Other;\n",
            ),
            (
                "a/b.rs",
                "use super::Parent;\nuse crate::a::Up;\nuse crate::Root;\n",
            ),
        ];
        assert!(cycle_paths(&list).is_empty());
    }

    #[test]
    fn modules_two_and_three_module_cycles_are_found() {
        let two = [
            ("lib.rs", ""),
            ("x.rs", "use crate::y::Y;\n"),
            ("y.rs", "pub(crate) use super::x::*;\n"),
        ];
        assert_eq!(cycle_paths(&two), ["x -> y -> x"]);
        let three = [
            ("lib.rs", ""),
            ("p/mod.rs", ""),
            ("p/a.rs", "use super::b::B;\n"),
            ("p/b.rs", "fn f() { super::c::g(); }\n"),
            ("p/c.rs", "use crate::p::{a::{self}, d};\n"),
            ("p/d.rs", "use super::a::A;\n"),
            ("q.rs", "use crate::p::a::A;\n"),
        ];
        let found = crate_cycles(&files(&three));
        assert_eq!(found.len(), 1);
        let shown: Vec<String> = found[0].path.iter().map(|p| show(p)).collect();
        assert_eq!(shown, ["p::a", "p::b", "p::c", "p::a"]);
        assert_eq!(found[0].others, [m("p::d")]);
        assert!(found[0]
            .report("k", "k")
            .ends_with("; the component also holds p::d"));
    }

    #[test]
    fn modules_acyclic_graph_and_test_only_uses_pass() {
        let list = [
            ("lib.rs", ""),
            ("a.rs", "use crate::b::B;\nuse crate::c::C;\n"),
            ("b.rs", "use crate::c::C;\n"),
            (
                "c.rs",
                "// use crate::a::A;\nconst S: &str = \"crate::a::A\";\n#[cfg(test)]\nmod tests;\n\
                 #[cfg(test)]\nmod inline {\n    use crate::a::A;\n}\n",
            ),
            ("c/tests.rs", "use crate::a::A;\n"),
        ];
        assert!(cycle_paths(&list).is_empty());
    }
}
