//! The README's "What works today" table against docs/readme-tests.yaml: every row of the
//! table names tests that exist, so that no claim of the README is left without a test
//! that would fail if it stopped being true (issue 46). Checked by a unit test (so by the
//! workspace tests of `cargo xtask test`, in CI).

use std::path::Path;

/// docs/readme-tests.yaml.
#[derive(Debug, serde::Deserialize)]
pub struct Map {
    pub rows: Vec<Row>,
}

#[derive(Debug, serde::Deserialize)]
pub struct Row {
    /// The first cell of the README's row, as written there.
    pub area: String,
    pub claims: Vec<Claim>,
}

#[derive(Debug, serde::Deserialize)]
pub struct Claim {
    pub feature: String,
    /// `PATH::FUNCTION`, PATH from the workspace root.
    pub tests: Vec<String>,
}

/// The first cells of the rows of the README's "What works today" table.
pub fn readme_areas(readme: &str) -> Vec<String> {
    readme
        .lines()
        .skip_while(|l| l.trim() != "## What works today")
        .skip(1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        // The header and its separator.
        .skip(2)
        .filter_map(|l| l.split('|').nth(1))
        .map(|c| c.trim().to_string())
        .collect()
}

/// What is wrong with `map` for `readme`, one line each; `exists` says whether a test
/// `PATH::FUNCTION` exists.
pub fn problems(readme: &str, map: &Map, exists: &dyn Fn(&str, &str) -> bool) -> Vec<String> {
    let areas = readme_areas(readme);
    let mut out = Vec::new();
    if areas.is_empty() {
        out.push("the README has no \"What works today\" table".to_string());
    }
    for a in &areas {
        match map.rows.iter().find(|r| &r.area == a) {
            None => out.push(format!("README row {a:?} has no entry")),
            Some(r) if r.claims.iter().all(|c| c.tests.is_empty()) => {
                out.push(format!("README row {a:?} names no test"))
            }
            Some(_) => {}
        }
    }
    for r in &map.rows {
        if !areas.contains(&r.area) {
            out.push(format!("entry {:?} is not a row of the README", r.area));
        }
        for c in &r.claims {
            for t in &c.tests {
                match t.rsplit_once("::") {
                    Some((path, name)) if exists(path, name) => {}
                    _ => out.push(format!(
                        "{:?} / {:?}: no test {t} (a `fn NAME(` in that file)",
                        r.area, c.feature
                    )),
                }
            }
        }
    }
    out
}

/// Whether `root/path` has a `fn name(`.
pub fn test_exists(root: &Path, path: &str, name: &str) -> bool {
    std::fs::read_to_string(root.join(path)).is_ok_and(|text| text.contains(&format!("fn {name}(")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn every_readme_row_names_tests_that_exist() {
        let root = crate::workspace_root();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let map: Map = serde_saphyr::from_str(
            &std::fs::read_to_string(root.join("docs/readme-tests.yaml")).unwrap(),
        )
        .expect("docs/readme-tests.yaml");
        let found = problems(&readme, &map, &|p, n| test_exists(&root, p, n));
        assert!(
            found.is_empty(),
            "docs/readme-tests.yaml:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn a_row_without_tests_or_a_missing_test_is_named() {
        let readme = "# x\n## What works today\n\n| Area | State |\n|---|---|\n| A | a |\n| B | b |\n\nmore\n";
        let map: Map = serde_saphyr::from_str(
            "rows:\n  - area: A\n    claims:\n      - feature: f\n        tests: [x.rs::gone]\n  - area: C\n    claims: []\n",
        )
        .unwrap();
        assert_eq!(
            problems(readme, &map, &|_, n| n != "gone"),
            vec![
                "README row \"B\" has no entry",
                "\"A\" / \"f\": no test x.rs::gone (a `fn NAME(` in that file)",
                "entry \"C\" is not a row of the README",
            ]
        );
    }
}
