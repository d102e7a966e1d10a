//! The source layout's one rule that a compiler does not check: the top-level modules (folders
//! and files) of the engine and of the app import one another without a cycle, so each concept
//! can be read, and changed, from the bottom up. Imports are read as `crate::name` paths outside
//! test code (a file's `#[cfg(test)]` part and `tests` files are skipped); the engine's
//! re-exports at its root (`crate::unet`, `crate::Error`, …) count as their folders. And the
//! studio's drawing functions (`*_ui.rs`) only ask: they send nothing, start no thread and load
//! nothing themselves (`studio/app/action.rs` carries their requests out after drawing).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The engine root's re-exports, mapped to the module that holds them (see engine/src/lib.rs).
const ENGINE_ALIASES: &[(&str, &str)] = &[
    ("clip", "models"),
    ("taesd", "models"),
    ("unet", "models"),
    ("vae", "models"),
    ("vae_compile", "models"),
    ("vae_tiling", "models"),
    ("Error", "error"),
    ("Result", "error"),
    ("image_io", "io"),
    ("parameters", "io"),
    ("LoadOptions", "stable_diffusion"),
    ("Precision", "stable_diffusion"),
    ("StableDiffusion", "stable_diffusion"),
    ("Refiner", "stable_diffusion"),
    ("TextEncoders", "stable_diffusion"),
];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `top-level module -> modules it imports` for the crate whose sources are in `src`.
fn imports(src: &Path, aliases: &[(&str, &str)]) -> Graph {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(src).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() {
            modules.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "lib"
            && stem != "main"
        {
            modules.insert(stem.to_string());
        }
    }
    let mut graph = Graph::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .unwrap()
                    .flatten()
                    .map(|e| e.path()),
            );
            continue;
        }
        let relative = path.strip_prefix(src).unwrap();
        let file = relative.file_name().unwrap().to_string_lossy();
        if !file.ends_with(".rs") || file.contains("tests") {
            continue;
        }
        let first = relative.iter().next().unwrap().to_string_lossy();
        let top = first.trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let name: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let name = aliases
                    .iter()
                    .find(|(a, _)| *a == name)
                    .map_or(name.clone(), |(_, m)| m.to_string());
                if name != top && modules.contains(&name) {
                    graph.entry(top.clone()).or_default().insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph`, as the modules on it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_import_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The least each crate's modules import, so a reader gone blind fails rather than passes.
    for (src, aliases, least) in [
        (root.join("engine/src"), ENGINE_ALIASES, 15),
        (root.join("app/src"), &[][..], 3),
    ] {
        let graph = imports(&src, aliases);
        assert!(graph.len() >= least, "{}: imports not read", src.display());
        assert_eq!(
            find_cycle(&graph),
            None,
            "{}: an import cycle",
            src.display()
        );
    }
}

#[test]
fn a_cycle_is_found() {
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .into_iter()
        .fold(Graph::new(), |mut g, (from, to)| {
            g.entry(from.into()).or_default().insert(to.into());
            g
        });
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

/// No studio panel acts while it draws: what a click asks for is recorded as an `Action` and
/// carried out after the frame (`app/src/studio/app/action.rs`).
#[test]
fn drawing_functions_only_ask() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../app/src/studio/app");
    let acting = [
        ".send(",
        "self.pick(",
        "thread::",
        "self.load_model(",
        "self.load_demo(",
        "self.choose_refiner(",
        "self.generate(",
        "self.cancel(",
        "self.settings_changed(",
        "self.set_preview_method(",
        "self.use_as_init(",
        "self.extend_init(",
        "self.restart_",
        "self.move_job(",
        "self.remove_job(",
        "self.queue.clear(",
    ];
    let mut panels = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with("_ui.rs") {
            continue;
        }
        panels += 1;
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for act in acting {
                assert!(
                    !line.contains(act),
                    "{name}:{}: a panel acts while drawing (`{act}`); ask for it instead: {line}",
                    n + 1
                );
            }
        }
    }
    assert!(
        panels >= 9,
        "only {panels} panels found in {}",
        dir.display()
    );
}
