//! The positional update operators: `$` (the array position the query's match recorded),
//! `$[]` (every element) and `$[<identifier>]` (the elements an `arrayFilters` entry matches).
//!
//! An operator whose path holds one is expanded, against the document being updated, into one
//! operator per concrete array index, which is then applied like any other.
//!
//! `$` takes the position mongod's matcher records while matching the pre-image (its
//! "elemMatchKey", [`Filter::matched_array_position`], the position the positional projection
//! uses too): `src/mongo/db/exec/update_stage.cpp` re-matches the document with match details
//! requested and hands the key to the update driver as the "matched field", which
//! `src/mongo/db/update/update_object_node.cpp` applies the positional child under, whatever
//! the element at that path is (an array's element, an object's field, or a path to create).

use super::*;
use crate::engine::matcher::Filter;

/// The query and array filters positional paths are resolved with.
#[derive(Debug, Clone, Default)]
pub(super) struct Positional {
    /// The statement's query, parsed, when a path holds `$`: its match records the position.
    query: Option<Filter>,
    /// `(identifier, filter over {identifier: element})`.
    filters: Vec<(String, Filter)>,
    /// The paths of the operators without positional elements, which a path made concrete by
    /// `$` must not collide with.
    plain_paths: Vec<Vec<String>>,
}

/// Whether a path element is positional.
pub(super) fn is_positional(part: &str) -> bool {
    part == "$" || (part.starts_with("$[") && part.ends_with(']'))
}

/// Checks one positional path element (`$`, `$[]`, `$[id]`) at `index` in `path`: none may
/// come first (`src/mongo/db/update/update_object_node.cpp`, `parseAndMerge` and
/// `parseArrayFilterIdentifier`: code 2, after the count of `$` elements), and an identifier
/// must be a lowercase letter followed by letters and digits.
pub(super) fn check_element(part: &str, index: usize, path: &str) -> CommandResult<()> {
    if index == 0 {
        if path.split('.').filter(|p| *p == "$").count() > 1 {
            return Err(CommandError::bad_value(format!(
                "Too many positional (i.e. '$') elements found in path '{path}'"
            )));
        }
        if part == "$" {
            return Err(CommandError::bad_value(format!(
                "Cannot have positional (i.e. '$') element in the first position in path '{path}'"
            )));
        }
        return Err(CommandError::bad_value(format!(
            "Cannot have array filter identifier (i.e. '$[<id>]') element in the first position in path '{path}'"
        )));
    }
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

/// No position recorded (or an upsert inserting, which has none): code 2, as
/// `UpdateObjectNode::apply` (`src/mongo/db/update/update_object_node.cpp`).
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
            // The common case costs nothing (the query is not parsed again).
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
        let dollar = ops.iter().any(|op| op.parts.iter().any(|p| p == "$"));
        Ok(Positional {
            query: if dollar {
                Some(Filter::parse(query)?)
            } else {
                None
            },
            filters,
            plain_paths: if dollar {
                // A `$rename` occupies its source and its target (update_object_node.cpp).
                ops.iter()
                    .filter(|op| !op.parts.iter().any(|p| is_positional(p)))
                    .flat_map(|op| {
                        let to = match &op.kind {
                            Kind::Rename(to_parts, _) => Some(to_parts.clone()),
                            _ => None,
                        };
                        std::iter::once(op.parts.clone()).chain(to)
                    })
                    .collect()
            } else {
                Vec::new()
            },
        })
    }

    /// The array position `$` stands for in an update of `pre_image` (the stored document,
    /// before any operator applies): the one the query's match recorded
    /// ([`Filter::matched_array_position`]). `None` without a `$` path, when nothing recorded
    /// a position, and when an upsert inserts (`src/mongo/db/exec/upsert_stage.cpp` applies
    /// the update to the seed document with an empty matched field).
    pub(super) fn matched_position(
        &self,
        pre_image: &Document,
        is_insert: bool,
        vars: &Vars,
    ) -> CommandResult<Option<usize>> {
        match &self.query {
            Some(query) if !is_insert => query.matched_array_position(pre_image, vars),
            _ => Ok(None),
        }
    }

    /// The concrete paths of `parts` in `doc`; `$` stands for `matched`
    /// ([`Positional::matched_position`]).
    pub(super) fn expand(
        &self,
        doc: &Document,
        parts: &[String],
        path: &str,
        matched: Option<usize>,
        vars: &Vars,
    ) -> CommandResult<Vec<Vec<String>>> {
        let Some(k) = parts.iter().position(|p| is_positional(p)) else {
            return Ok(vec![parts.to_vec()]);
        };
        let prefix = &parts[..k];
        if parts[k] == "$" {
            // `UpdateObjectNode::apply` (update_object_node.cpp) refuses a missing position,
            // then applies the operator under the field named by the position, whatever the
            // element at the prefix is: an array's element, an object's field named by the
            // digits, or a path to create (or to refuse, as any path).
            let i = matched.ok_or_else(no_positional_match)?;
            let mut concrete: Vec<String> = prefix.to_vec();
            concrete.push(i.to_string());
            concrete.extend(parts[k + 1..].iter().cloned());
            self.check_merge(&concrete)?;
            return self.expand(doc, &concrete, path, matched, vars);
        }
        let prefix_path = prefix.join(".");
        let arr = match lookup(doc, prefix) {
            Some(Bson::Array(a)) => a,
            Some(other) => {
                return Err(CommandError::bad_value(format!(
                    "Cannot apply array updates to non-array element {}: {}",
                    prefix.last().map(String::as_str).unwrap_or(""),
                    crate::keys::render(other)
                )))
            }
            None => {
                return Err(CommandError::bad_value(format!(
                    "The path '{prefix_path}' must exist in the document in order to apply array updates."
                )))
            }
        };
        let indexes: Vec<usize> = if parts[k] == "$[]" {
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
            out.extend(self.expand(doc, &concrete, path, matched, vars)?);
        }
        Ok(out)
    }

    /// A path `$` made concrete must not fall on or under (or above) the path of another
    /// operator: mongod merges the positional child with the child of the same name and
    /// refuses two operators on one spot with code 40 at the shorter path
    /// (`UpdateNode::createUpdateNodeByMerging`, `src/mongo/db/update/update_node.cpp`).
    fn check_merge(&self, concrete: &[String]) -> CommandResult<()> {
        for other in &self.plain_paths {
            let n = other.len().min(concrete.len());
            if other[..n] == concrete[..n] {
                return Err(CommandError::new(
                    40,
                    "ConflictingUpdateOperators",
                    format!("Update created a conflict at '{}'", concrete[..n].join(".")),
                ));
            }
        }
        Ok(())
    }
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
