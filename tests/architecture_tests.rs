//! The shape of the code, checked: modules stand on floors with no import circle between them,
//! and the floors docs/ARCHITECTURE.md names keep their rules (what each module may never
//! import). Read from the source's `use` lines and paths, as a reader would; test code
//! (`tests.rs`, `testing.rs` and the `#[cfg(test)] mod tests` at the end of a file) is left out,
//! since a test may reach anywhere to set its scene.

#![expect(
    clippy::unwrap_used,
    reason = "helpers outside #[test] functions fail the test loudly too"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules by path (`["proxy", "route"]`), each with the modules it imports.
type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// What a top-level module must never import, and why (docs/ARCHITECTURE.md, "Floors").
const NEVER: &[(&str, &[&str], &str)] = &[
    (
        "upstream",
        &[
            "proxy",
            "router",
            "fleet",
            "curve",
            "telemetry",
            "sse",
            "live",
            "gateway",
            "admin",
        ],
        "the transport imports nothing but config, tls and errors",
    ),
    (
        "fleet",
        &[
            "proxy", "router", "live", "gateway", "admin", "stack", "cluster",
        ],
        "backend state sits below the router, the stack and the cluster link",
    ),
    (
        "router",
        &[
            "proxy", "live", "gateway", "admin", "stack", "upstream", "cluster",
        ],
        "the router decides over the fleet and knows nothing of HTTP or the stack",
    ),
    (
        "curve",
        &[
            "config",
            "proxy",
            "router",
            "fleet",
            "upstream",
            "telemetry",
            "live",
        ],
        "curves are pure: time comes in as an argument (a stream's timing, read by sse, too)",
    ),
    (
        "sse",
        &[
            "config",
            "proxy",
            "router",
            "fleet",
            "upstream",
            "curve",
            "telemetry",
        ],
        "the SSE parser is pure",
    ),
    (
        "prefix",
        &[
            "config",
            "proxy",
            "router",
            "fleet",
            "upstream",
            "curve",
            "telemetry",
            "sim",
            "live",
        ],
        "prefix hashing and its LRU are pure, shared by the simulator's truth and the index",
    ),
    (
        "translate",
        &[
            "config",
            "proxy",
            "router",
            "fleet",
            "upstream",
            "curve",
            "telemetry",
            "live",
            "gateway",
            "admin",
            "stack",
        ],
        "translation is bytes to bytes, below the layers that call it, after the decision",
    ),
    (
        "tenant",
        &[
            "proxy", "router", "fleet", "upstream", "live", "gateway", "admin", "stack",
        ],
        "a key's limits and usage are counts below the layer that checks them",
    ),
    (
        "telemetry",
        &[
            "proxy", "router", "fleet", "upstream", "live", "admin", "tenant",
        ],
        "metric names and handles sit below everything that records them",
    ),
    (
        "config",
        &[
            "proxy",
            "router",
            "fleet",
            "upstream",
            "live",
            "gateway",
            "telemetry",
        ],
        "config is read by everyone and reads no one above it",
    ),
    (
        "proxy",
        &["live", "gateway", "admin", "cli", "demo", "cluster"],
        "the request path never reaches up to what runs it, nor waits on Redis",
    ),
    (
        "cluster",
        &["proxy", "gateway", "admin", "cli", "demo", "stack"],
        "the cluster link syncs the fleet's state beside the request path, never in it",
    ),
    (
        "otel",
        &[
            "proxy", "router", "fleet", "upstream", "live", "gateway", "admin", "stack",
        ],
        "the tracer knows spans and OTLP, nothing of the request path that makes them",
    ),
    (
        "discovery",
        &[
            "proxy", "router", "fleet", "upstream", "live", "gateway", "admin", "stack",
        ],
        "discovery turns DNS answers into backend configs; the live state builds on them",
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module file under `src/` but test code, with its module path.
fn modules() -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&src(), &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src()).unwrap();
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let last = parts.pop().unwrap();
        let stem = last.trim_end_matches(".rs");
        // Unit tests, in a `tests.rs` or a `tests/` folder of their own, are not rooms.
        let test_only = matches!(stem, "tests" | "testing") || parts.iter().any(|p| p == "tests");
        if test_only || (parts.is_empty() && stem == "main") {
            continue;
        }
        if !matches!(stem, "mod" | "lib") {
            parts.push(stem.to_owned());
        }
        modules.insert(parts, file);
    }
    modules
}

/// The source without comments and without a trailing `#[cfg(test)] mod tests { ... }`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string literal ("http://...") is not a comment.
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path a `use` tree names, expanded (`a::{b, c::d}` -> `a::b`, `a::c::d`).
fn use_paths(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let Some(open) = tree.find('{') else {
            out.push(format!("{prefix}{tree}"));
            return;
        };
        let head = &tree[..open];
        let inner = &tree[open + 1..tree.len() - 1];
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&format!("{prefix}{head}"), &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if start < inner.len() {
            expand(&format!("{prefix}{head}"), &inner[start..], out);
        }
    }
    let mut out = Vec::new();
    expand("", &tree, &mut out);
    out
}

/// The module a path names from inside `at`: the longest prefix that is a module file.
fn resolve(
    at: &[String],
    path: &str,
    known: &BTreeMap<Vec<String>, PathBuf>,
) -> Option<Vec<String>> {
    let mut segments = path.split("::").map(str::to_owned).peekable();
    let mut base: Vec<String> = match segments.peek().map(String::as_str) {
        Some("crate") => {
            segments.next();
            Vec::new()
        }
        // A module's path is its own (`proxy::route` for `proxy/route.rs`, `proxy` for
        // `proxy/mod.rs`): `self` is it, each `super` one step up.
        Some("self") => {
            segments.next();
            at.to_vec()
        }
        Some("super") => {
            let mut base = at.to_vec();
            while segments.peek().map(String::as_str) == Some("super") {
                segments.next();
                base.pop();
            }
            base
        }
        _ => return None,
    };
    let mut found = known.contains_key(&base).then(|| base.clone());
    for segment in segments {
        base.push(segment);
        if known.contains_key(&base) {
            found = Some(base.clone());
        }
    }
    found
}

/// The import graph between module files. An edge from a module to one of its own descendants
/// (its `mod` declarations and re-exports) is the module tree itself, not an import.
fn graph() -> Graph {
    let known = modules();
    let mut graph = Graph::new();
    for (module, file) in &known {
        let text = code(&std::fs::read_to_string(file).unwrap());
        let mut paths = Vec::new();
        for statement in text.split(';') {
            let statement = statement.trim_start();
            let tree = statement
                .strip_prefix("pub use ")
                .or_else(|| statement.strip_prefix("pub(crate) use "))
                .or_else(|| statement.strip_prefix("use "));
            if let Some(tree) = tree {
                paths.extend(use_paths(tree));
            }
        }
        // Paths written out in the code (`crate::telemetry::count_retry(...)`).
        for start in ["crate::", "super::"] {
            for (at, _) in text.match_indices(start) {
                let before = text[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let path: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                paths.push(path.trim_end_matches(':').to_owned());
            }
        }
        let targets = graph.entry(module.clone()).or_default();
        for path in paths {
            if let Some(target) = resolve(module, &path, &known)
                && target != *module
                && !target.starts_with(module)
            {
                targets.insert(target);
            }
        }
    }
    graph
}

/// The circles of `graph` (strongly connected components of more than one module), by
/// Tarjan's algorithm.
fn circles(graph: &Graph) -> Vec<Vec<Vec<String>>> {
    struct Walk<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g Vec<String>) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "lib".to_owned()
    } else {
        module.join("::")
    }
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = graph();
    assert!(
        graph.len() > 40,
        "the source was read: {} modules",
        graph.len()
    );
    let found = circles(&graph);
    let described: Vec<String> = found
        .iter()
        .map(|c| c.iter().map(|m| name(m)).collect::<Vec<_>>().join(" <-> "))
        .collect();
    assert!(
        described.is_empty(),
        "import circles (break each by moving what both need below both):\n{}",
        described.join("\n")
    );
}

#[test]
fn each_floor_keeps_its_rule_of_what_it_never_imports() {
    let graph = graph();
    let mut broken = Vec::new();
    for (module, targets) in &graph {
        let Some(top) = module.first() else { continue };
        for (floor, never, why) in NEVER {
            if top != floor {
                continue;
            }
            for target in targets {
                if target.first().is_some_and(|t| never.contains(&t.as_str())) {
                    broken.push(format!("{} imports {}: {why}", name(module), name(target)));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The "may import" column of docs/ARCHITECTURE.md's table of floors, per top-level module:
/// `None` where it says "everything below" (the command line's row), the names otherwise.
fn may_import() -> BTreeMap<String, Option<BTreeSet<String>>> {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"))
            .unwrap();
    let floors = page.split("## Floors").nth(1).unwrap();
    let floors = floors.split("\n## ").next().unwrap();
    let mut rows = BTreeMap::new();
    for line in floors.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (names, may) = (cells[1], cells[3]);
        let allowed = match may {
            "everything below" => None,
            "nothing of the crate" => Some(BTreeSet::new()),
            list => Some(
                list.split(',')
                    .map(|m| m.trim().trim_matches('`').to_owned())
                    .collect(),
            ),
        };
        for name in names.split(',') {
            rows.insert(name.trim().trim_matches('`').to_owned(), allowed.clone());
        }
    }
    rows
}

#[test]
fn each_module_imports_only_what_architecture_md_says_it_may() {
    let table = may_import();
    assert!(table.len() > 20, "the table was read: {} rows", table.len());
    let mut broken = BTreeSet::new();
    for (module, targets) in graph() {
        let Some(top) = module.first() else { continue };
        let Some(allowed) = table.get(top) else {
            broken.insert(format!(
                "{top} has no row in docs/ARCHITECTURE.md's table of floors: add one"
            ));
            continue;
        };
        let Some(allowed) = allowed else { continue };
        for target in targets {
            let Some(to) = target.first().filter(|t| *t != top) else {
                continue;
            };
            if !allowed.contains(to) {
                broken.insert(format!(
                    "{} imports {}, which {top}'s row of docs/ARCHITECTURE.md does not allow (move the code, or say why in the table)",
                    name(&module),
                    name(&target)
                ));
            }
        }
    }
    let broken: Vec<String> = broken.into_iter().collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// What reads the clock or waits: a module that does neither takes time as an argument.
const CLOCK_OR_WAIT: &[&str] = &[
    "Instant::now",
    "SystemTime::now",
    ".elapsed()",
    "async fn",
    ".await",
];

#[test]
fn routing_decisions_and_curves_read_no_clock_and_wait_on_nothing() {
    // The router's benchmark-only oracle asks the simulator; its line is where a request waits.
    let apart = [["router", "wait"], ["router", "oracle"]];
    let mut broken = Vec::new();
    let mut read = 0;
    for (module, file) in modules() {
        let floor = module.first().map(String::as_str);
        if !matches!(floor, Some("router" | "curve")) || apart.iter().any(|a| module == a) {
            continue;
        }
        read += 1;
        let text = code(&std::fs::read_to_string(&file).unwrap());
        for word in CLOCK_OR_WAIT {
            if text.contains(word) {
                broken.push(format!("{} uses `{word}`", name(&module)));
            }
        }
    }
    assert!(
        read >= 10,
        "the router's and curve's files were read: {read}"
    );
    assert!(
        broken.is_empty(),
        "a decision takes `Ask::now`, a curve its `now` argument; waiting belongs in router/wait.rs:\n{}",
        broken.join("\n")
    );
}

/// One decision is read one rule at a time: each rung imports what it reads (the scene, the
/// candidates, the words of `ask` and `decision`), never the ladder that climbs it nor the
/// router (`router/mod.rs`) that runs the ladder.
#[test]
fn no_rung_imports_the_ladder_or_the_router_that_climbs_it() {
    let graph = graph();
    let rungs: Vec<&Vec<String>> = graph
        .keys()
        .filter(|m| m.len() == 3 && m[0] == "router" && m[1] == "rungs")
        .collect();
    assert!(rungs.len() >= 8, "the rungs were read: {rungs:?}");
    let above = [
        vec!["router".to_owned()],
        vec!["router".to_owned(), "ladder".to_owned()],
    ];
    let broken: Vec<String> = rungs
        .iter()
        .flat_map(|rung| {
            graph[*rung]
                .iter()
                .filter(|t| above.contains(t))
                .map(move |t| format!("{} imports {}", name(rung), name(t)))
        })
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Every Rust file under `dir`.
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

/// A file a reader can hold in mind: none over 800 lines, tests and benches included.
#[test]
fn no_source_file_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for dir in ["src", "tests", "benches"] {
        for file in rust_files(&root.join(dir)) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > 800 {
                long.push(format!("{} has {lines} lines", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "split by topic:\n{}", long.join("\n"));
}

/// The functions of a file, by name, with their length in lines (signature to closing brace,
/// found by the brace at the signature's indentation, as rustfmt writes them).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let signature = ["pub(crate) ", "pub(super) ", "pub ", "const ", "async ", ""]
            .iter()
            .filter_map(|p| trimmed.strip_prefix(p))
            .find_map(|rest| {
                rest.strip_prefix("async ")
                    .unwrap_or(rest)
                    .strip_prefix("fn ")
            });
        let Some(rest) = signature else { continue };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // A body opens before a `;` ends the signature (a trait's method without one).
        let Some(open) = lines[i..]
            .iter()
            .position(|l| l.contains('{') || l.trim_end().ends_with(';'))
        else {
            continue;
        };
        if !lines[i + open].contains('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if lines[i + open].trim_end().ends_with('}') {
            out.push((name, open + 1));
            continue;
        }
        if let Some(end) = lines[i + open..].iter().position(|l| *l == close) {
            out.push((name, open + end + 1));
        }
    }
    out
}

/// The router is read one rule at a time: no function in it over 80 lines.
#[test]
fn no_function_in_the_router_is_over_80_lines() {
    let mut long = Vec::new();
    let mut read = 0;
    for file in rust_files(&src().join("router")) {
        for (name, lines) in function_lengths(&std::fs::read_to_string(&file).unwrap()) {
            read += 1;
            if lines > 80 {
                long.push(format!("{}: {name} has {lines} lines", file.display()));
            }
        }
    }
    assert!(read > 100, "the router's functions were read: {read}");
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn the_check_sees_a_circle_and_a_forbidden_import_when_there_is_one() {
    // The reader itself, on lines shaped as the source writes them.
    assert_eq!(
        use_paths("super::{body::ProxyBody, route::{Tried, ask}}"),
        [
            "super::body::ProxyBody",
            "super::route::Tried",
            "super::route::ask"
        ]
    );
    let mut graph = Graph::new();
    let m = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
    graph.entry(m("a")).or_default().insert(m("b::c"));
    graph.entry(m("b::c")).or_default().insert(m("d"));
    graph.entry(m("d")).or_default().insert(m("a"));
    graph.entry(m("e")).or_default().insert(m("a"));
    assert_eq!(circles(&graph).len(), 1);
    assert_eq!(circles(&graph)[0].len(), 3);
    let known: BTreeMap<_, _> = [m("proxy"), m("proxy::route"), m("fleet")]
        .into_iter()
        .map(|k| (k, PathBuf::new()))
        .collect();
    assert_eq!(
        resolve(&m("proxy::retry"), "super::route::Tried", &known),
        Some(m("proxy::route"))
    );
    assert_eq!(
        resolve(&m("proxy::retry"), "crate::fleet::Backend", &known),
        Some(m("fleet"))
    );
    let lengths = function_lengths(
        "fn short() {\n    1\n}\n\n    pub(crate) fn long(\n        a: u32,\n    ) -> u32 {\n        a\n    }\nfn tiny() {}\n",
    );
    assert_eq!(
        lengths,
        [
            ("short".to_owned(), 3),
            ("long".to_owned(), 5),
            ("tiny".to_owned(), 1)
        ]
    );
}
