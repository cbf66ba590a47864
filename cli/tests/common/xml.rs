//! A strict small XML reader for the tests: the conformance kit's JUnit
//! report and the demo's SVG chart must be well-formed.

/// An XML element: its name, its attributes, and the character data
/// directly inside it (trimmed, pieces joined by a newline).
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub text: String,
}

/// A strict small XML reader, enough to say a report is well-formed: an
/// optional declaration, one root element, elements with quoted
/// attributes, character data with the predefined entities and character
/// references, nothing XML 1.0 forbids. Returns each element in document
/// order.
pub fn parse_xml(s: &str) -> Result<Vec<Element>, String> {
    fn entities(t: &str) -> Result<(), String> {
        let mut rest = t;
        while let Some(i) = rest.find('&') {
            let after = &rest[i + 1..];
            let end = after.find(';').ok_or_else(|| format!("unterminated entity in {t:?}"))?;
            let e = &after[..end];
            let ok = matches!(e, "amp" | "lt" | "gt" | "quot" | "apos")
                || e.strip_prefix("#x")
                    .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
                || e.strip_prefix('#')
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(format!("bad entity &{e}; in {t:?}"));
            }
            rest = &after[end + 1..];
        }
        if let Some(c) = t.chars().find(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r')) {
            return Err(format!("control character {c:?} in {t:?}"));
        }
        Ok(())
    }
    fn name(s: &str) -> (&str, &str) {
        let end = s.find(|c: char| !(c.is_alphanumeric() || "_-.:".contains(c))).unwrap_or(s.len());
        (&s[..end], &s[end..])
    }
    let mut rest = s.trim_start();
    if let Some(r) = rest.strip_prefix("<?xml") {
        rest = &r[r.find("?>").ok_or("unterminated declaration")? + 2..];
    }
    // The open elements: names and their places in `elements`.
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut elements = Vec::new();
    let mut roots = 0;
    loop {
        let lt = rest.find('<');
        let text = &rest[..lt.unwrap_or(rest.len())];
        if stack.is_empty() && !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        entities(text)?;
        if let (Some((_, at)), t) = (stack.last(), text.trim()) {
            if !t.is_empty() {
                let e: &mut Element = &mut elements[*at];
                if !e.text.is_empty() {
                    e.text.push('\n');
                }
                e.text.push_str(t);
            }
        }
        let Some(lt) = lt else { break };
        rest = &rest[lt + 1..];
        if let Some(r) = rest.strip_prefix('/') {
            let (n, r) = name(r);
            let r = r.trim_start().strip_prefix('>').ok_or_else(|| format!("bad end tag {n}"))?;
            if stack.pop().map(|(open, _)| open).as_deref() != Some(n) {
                return Err(format!("end tag {n} does not close the open element"));
            }
            rest = r;
            continue;
        }
        let (n, mut r) = name(rest);
        if n.is_empty() {
            return Err(format!("bad tag at {:?}", &rest[..rest.len().min(20)]));
        }
        if stack.is_empty() {
            roots += 1;
        }
        let mut attrs = Vec::new();
        loop {
            r = r.trim_start();
            if let Some(x) = r.strip_prefix("/>") {
                rest = x;
                break;
            }
            if let Some(x) = r.strip_prefix('>') {
                stack.push((n.to_string(), elements.len()));
                rest = x;
                break;
            }
            let (a, x) = name(r);
            let x = x.strip_prefix('=').ok_or_else(|| format!("attribute {a} of {n} has no value"))?;
            let q = x.chars().next().filter(|c| *c == '"' || *c == '\'').ok_or("unquoted attribute")?;
            let end = x[1..].find(q).ok_or("unterminated attribute")?;
            let value = &x[1..1 + end];
            if value.contains('<') {
                return Err(format!("'<' in attribute {a}"));
            }
            entities(value)?;
            if attrs.iter().any(|(k, _): &(String, String)| k == a) {
                return Err(format!("attribute {a} twice on {n}"));
            }
            attrs.push((a.to_string(), value.to_string()));
            r = &x[end + 2..];
        }
        elements.push(Element { name: n.to_string(), attrs, text: String::new() });
    }
    if !stack.is_empty() || roots != 1 {
        let open: Vec<&str> = stack.iter().map(|(n, _)| n.as_str()).collect();
        return Err(format!("unclosed elements {open:?} or {roots} roots"));
    }
    Ok(elements)
}

/// The value of attribute `k` of `e`, which must have it.
pub fn attr<'a>(e: &'a Element, k: &str) -> &'a str {
    e.attrs
        .iter()
        .find(|(a, _)| a == k)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{} has no {k}", e.name))
}
