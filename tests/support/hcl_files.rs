//! Reading the repository's HCL files (`nomad/`, `terraform/`) in the tests that check them.

use std::path::PathBuf;

use hcl::{Block, BlockLabel, Body, Expression};

pub fn repo_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub fn read(relative: &str) -> String {
    let path = repo_path(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

pub fn parse_text(text: &str, what: &str) -> Body {
    hcl::from_str::<Body>(text).unwrap_or_else(|e| panic!("{what} is not valid HCL: {e}"))
}

pub fn parse(relative: &str) -> Body {
    parse_text(&read(relative), relative)
}

pub fn label_text(label: &BlockLabel) -> &str {
    match label {
        BlockLabel::Identifier(ident) => ident.as_str(),
        BlockLabel::String(s) => s,
    }
}

pub fn blocks<'a>(body: &'a Body, ident: &str) -> Vec<&'a Block> {
    body.blocks().filter(|b| b.identifier() == ident).collect()
}

pub fn block<'a>(body: &'a Body, ident: &str) -> &'a Block {
    let found = blocks(body, ident);
    assert_eq!(found.len(), 1, "expected one {ident} block");
    found[0]
}

pub fn labelled<'a>(body: &'a Body, ident: &str, labels: &[&str]) -> &'a Block {
    blocks(body, ident)
        .into_iter()
        .find(|b| b.labels().iter().map(label_text).eq(labels.iter().copied()))
        .unwrap_or_else(|| panic!("no {ident} {labels:?} block"))
}

pub fn optional_attr<'a>(body: &'a Body, key: &str) -> Option<&'a Expression> {
    body.attributes().find(|a| a.key() == key).map(|a| a.expr())
}

pub fn attr<'a>(body: &'a Body, key: &str) -> &'a Expression {
    optional_attr(body, key).unwrap_or_else(|| panic!("no attribute {key}"))
}
