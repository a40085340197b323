//! The positional update operators: `$` (the array element the query matched), `$[]` (every
//! element) and `$[<identifier>]` (the elements an `arrayFilters` entry matches).
//!
//! An operator whose path holds one is expanded, against the document being updated, into one
//! operator per concrete array index, which is then applied like any other.

use super::*;
use crate::engine::matcher::{ElementCondition, Filter};

/// The query and array filters positional paths are resolved with.
#[derive(Debug, Clone, Default)]
pub(super) struct Positional {
    query: Document,
    /// `(identifier, filter over {identifier: element})`.
    filters: Vec<(String, Filter)>,
}

/// Whether a path element is positional.
pub(super) fn is_positional(part: &str) -> bool {
    part == "$" || (part.starts_with("$[") && part.ends_with(']'))
}

/// Checks one positional path element (`$`, `$[]`, `$[id]`).
pub(super) fn check_element(part: &str, path: &str) -> CommandResult<()> {
    if part == "$" || part == "$[]" {
        return Ok(());
    }
    let Some(id) = part.strip_prefix("$[").and_then(|p| p.strip_suffix(']')) else {
        return Ok(());
    };
    let valid = id.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && id.chars().all(|c| c.is_ascii_alphanumeric());
    if !valid {
        return Err(CommandError::bad_value(format!(
            "The array filter identifier '{id}' in path '{path}' must begin with a lowercase letter and contain only alphanumeric characters"
        )));
    }
    Ok(())
}

fn identifier(part: &str) -> Option<&str> {
    part.strip_prefix("$[")
        .and_then(|p| p.strip_suffix(']'))
        .filter(|id| !id.is_empty())
}

fn no_positional_match() -> CommandError {
    CommandError::bad_value("The positional operator did not find the match needed from the query.")
}

impl Positional {
    /// Parses `arrayFilters` and checks them against the paths of `ops`.
    pub(super) fn new(
        ops: &[Op],
        query: &Document,
        array_filters: Option<&Bson>,
    ) -> CommandResult<Positional> {
        let positional_paths = ops
            .iter()
            .any(|op| op.parts.iter().any(|p| is_positional(p)));
        let no_filters = match array_filters {
            None | Some(Bson::Null) => true,
            Some(Bson::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        if !positional_paths && no_filters {
            // The common case costs nothing (no copy of the query).
            return Ok(Positional::default());
        }
        let mut filters: Vec<(String, Filter)> = Vec::new();
        match array_filters {
            None | Some(Bson::Null) => {}
            Some(Bson::Array(items)) => {
                for item in items {
                    let Bson::Document(f) = item else {
                        return Err(CommandError::type_mismatch(
                            "BSON field 'arrayFilters' is the wrong type, expected type 'object'",
                        ));
                    };
                    let mut id: Option<&str> = None;
                    for k in f.keys() {
                        let top = k.split('.').next().unwrap_or("");
                        match id {
                            None => id = Some(top),
                            Some(prev) if prev != top => {
                                return Err(CommandError::failed_to_parse(format!(
                                    "Error parsing array filter :: caused by :: Expected a single top-level field name, found '{prev}' and '{top}'"
                                )))
                            }
                            Some(_) => {}
                        }
                    }
                    let Some(id) = id else {
                        return Err(CommandError::failed_to_parse(
                            "Cannot use an expression without a top-level field name in arrayFilters",
                        ));
                    };
                    if filters.iter().any(|(x, _)| x == id) {
                        return Err(CommandError::failed_to_parse(format!(
                            "Found multiple array filters with the same top-level field name {id}"
                        )));
                    }
                    filters.push((id.to_string(), Filter::parse(f)?));
                }
            }
            Some(_) => {
                return Err(CommandError::type_mismatch(
                    "BSON field 'arrayFilters' is the wrong type, expected type 'array'",
                ))
            }
        }
        let mut used: Vec<&str> = Vec::new();
        for op in ops {
            for part in &op.parts {
                if let Some(id) = identifier(part) {
                    if !filters.iter().any(|(x, _)| x == id) {
                        return Err(CommandError::bad_value(format!(
                            "No array filter found for identifier '{id}' in path '{}'",
                            op.path
                        )));
                    }
                    used.push(id);
                }
            }
        }
        if let Some((unused, _)) = filters.iter().find(|(id, _)| !used.contains(&id.as_str())) {
            return Err(CommandError::failed_to_parse(format!(
                "The array filter for identifier '{unused}' was not used in the update"
            )));
        }
        Ok(Positional {
            query: query.clone(),
            filters,
        })
    }

    /// The concrete paths of `parts` in `doc`.
    pub(super) fn expand(
        &self,
        doc: &Document,
        parts: &[String],
        path: &str,
        is_insert: bool,
        vars: &Vars,
    ) -> CommandResult<Vec<Vec<String>>> {
        let Some(k) = parts.iter().position(|p| is_positional(p)) else {
            return Ok(vec![parts.to_vec()]);
        };
        let prefix = &parts[..k];
        let prefix_path = prefix.join(".");
        if parts[k] == "$" && is_insert {
            return Err(no_positional_match());
        }
        let arr = match lookup(doc, prefix) {
            Some(Bson::Array(a)) => a,
            Some(other) if parts[k] != "$" => {
                return Err(CommandError::bad_value(format!(
                    "Cannot apply array updates to non-array element {}: {}",
                    prefix.last().map(String::as_str).unwrap_or(""),
                    crate::keys::render(other)
                )))
            }
            None if parts[k] != "$" => {
                return Err(CommandError::bad_value(format!(
                    "The path '{prefix_path}' must exist in the document in order to apply array updates."
                )))
            }
            _ => return Err(no_positional_match()),
        };
        let indexes: Vec<usize> = if parts[k] == "$" {
            vec![self
                .matched_index(&prefix_path, arr, vars)?
                .ok_or_else(no_positional_match)?]
        } else if parts[k] == "$[]" {
            (0..arr.len()).collect()
        } else {
            let id = identifier(&parts[k]).unwrap_or("");
            let filter = self
                .filters
                .iter()
                .find(|(x, _)| x == id)
                .map(|(_, f)| f)
                .ok_or_else(|| {
                    CommandError::bad_value(format!(
                        "No array filter found for identifier '{id}' in path '{path}'"
                    ))
                })?;
            let mut out = Vec::new();
            for (i, el) in arr.iter().enumerate() {
                let mut probe = Document::new();
                probe.insert(id, el.clone());
                if filter.matches(&probe, vars)? {
                    out.push(i);
                }
            }
            out
        };
        let mut out = Vec::new();
        for i in indexes {
            let mut concrete: Vec<String> = prefix.to_vec();
            concrete.push(i.to_string());
            concrete.extend(parts[k + 1..].iter().cloned());
            out.extend(self.expand(doc, &concrete, path, is_insert, vars)?);
        }
        Ok(out)
    }

    /// The index of the first element of the array at `array_path` that satisfies every
    /// condition the query puts on that array (`{a: 5}`, `{"a.x": 1}`, `{a: {$elemMatch: ..}}`,
    /// through top-level `$and`).
    fn matched_index(
        &self,
        array_path: &str,
        arr: &[Bson],
        vars: &Vars,
    ) -> CommandResult<Option<usize>> {
        query_matched_index(&self.query, array_path, arr, vars)
    }
}

/// The index of the first element of the array at `array_path` that satisfies every condition
/// `query` puts on that array (`{a: 5}`, `{"a.x": 1}`, `{a: {$elemMatch: ..}}`, through
/// top-level `$and`): what the positional `$` of an update or a projection stands for.
pub(crate) fn query_matched_index(
    query: &Document,
    array_path: &str,
    arr: &[Bson],
    vars: &Vars,
) -> CommandResult<Option<usize>> {
    enum Cond {
        Element(ElementCondition),
        Field(Filter),
    }
    let mut conds = Vec::new();
    let mut stack: Vec<&Document> = vec![query];
    while let Some(q) = stack.pop() {
        for (k, v) in q {
            if k == "$and" {
                if let Bson::Array(items) = v {
                    stack.extend(items.iter().filter_map(Bson::as_document));
                }
            } else if k == array_path {
                let cond = match v {
                    Bson::Document(d) if d.len() == 1 && d.contains_key("$elemMatch") => {
                        ElementCondition::parse(d.get("$elemMatch").unwrap_or(&Bson::Null))?
                    }
                    other => ElementCondition::parse(other)?,
                };
                conds.push(Cond::Element(cond));
            } else if let Some(rest) = k.strip_prefix(array_path).and_then(|r| r.strip_prefix('.'))
            {
                let mut f = Document::new();
                f.insert(rest, v.clone());
                conds.push(Cond::Field(Filter::parse(&f)?));
            }
        }
    }
    if conds.is_empty() {
        return Ok(None);
    }
    'elements: for (i, el) in arr.iter().enumerate() {
        for c in &conds {
            let ok = match (c, el) {
                (Cond::Element(e), _) => e.matches(el, vars)?,
                (Cond::Field(f), Bson::Document(d)) => f.matches(d, vars)?,
                (Cond::Field(_), _) => false,
            };
            if !ok {
                continue 'elements;
            }
        }
        return Ok(Some(i));
    }
    Ok(None)
}

/// The value at concrete `parts` (numeric parts index arrays).
fn lookup<'a>(doc: &'a Document, parts: &[String]) -> Option<&'a Bson> {
    let (first, rest) = parts.split_first()?;
    let mut cur = doc.get(first)?;
    for p in rest {
        cur = match cur {
            Bson::Document(d) => d.get(p)?,
            Bson::Array(a) => a.get(p.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}
