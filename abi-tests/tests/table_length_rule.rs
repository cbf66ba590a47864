//! How long a table may be at an older minor is stated once, in the
//! header's rules (`cbindgen.toml`, generated into `include/memplug.h`),
//! and quoted word for word by `docs/VENDORS.md`, `docs/ABI-CHANGELOG.md`,
//! the README and the C example plugins. This fails when a copy differs from
//! the header or when one of them says the contrary again.

use memplug_test_support::repo_root;

const START: &str = "Table length at an older minor:";

/// The text with comment and quote markers at line starts dropped and
/// whitespace collapsed, so a quote wrapped differently still matches.
fn normalised(text: &str) -> String {
    let lines = text.lines().map(|l| {
        let mut l = l.trim_start();
        loop {
            let before = l;
            for p in ["/*", "*", "//", ">", "- "] {
                l = l.strip_prefix(p).unwrap_or(l).trim_start();
            }
            if l == before {
                break l;
            }
        }
    });
    lines.collect::<Vec<_>>().join(" ").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rule as the header states it: from its opening words to the end of
/// its sentence.
fn rule() -> String {
    let header = normalised(&std::fs::read_to_string(repo_root().join("include/memplug.h")).unwrap());
    let at = header.find(START).expect("the header states the table length rule");
    let end = header[at..].find("brings.").expect("the rule ends with 'brings.'") + "brings.".len();
    header[at..at + end].to_string()
}

#[test]
fn the_table_length_rule_is_stated_once_and_quoted_everywhere_else() {
    let rule = rule();
    assert_eq!(
        normalised(&std::fs::read_to_string(repo_root().join("include/memplug.h")).unwrap())
            .matches(START)
            .count(),
        1,
        "the header states the rule once"
    );
    for (file, contrary) in [
        ("docs/VENDORS.md", &["no table length"][..]),
        ("docs/ABI-CHANGELOG.md", &["1.0-sized tables"][..]),
        ("README.md", &[][..]),
        ("c-examples/plugin/example_plugin.c", &[][..]),
        ("c-examples/plugin/full_plugin.c", &[][..]),
    ] {
        let text = normalised(&std::fs::read_to_string(repo_root().join(file)).unwrap());
        assert!(text.contains(&rule), "{file} does not quote the header's rule word for word:\n{rule}");
        for c in contrary {
            assert!(!text.contains(c), "{file} says {c:?}, against the header's rule");
        }
    }
}
