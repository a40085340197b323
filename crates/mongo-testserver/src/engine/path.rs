//! Dotted field paths: looking values up with MongoDB's implicit array traversal.

use bson::{Bson, Document};

/// Parses an array index path component as MongoDB does (digits only, no sign).
pub fn array_index(part: &str) -> Option<usize> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    part.parse().ok()
}

/// The values a query path reaches in `doc`, as the query matcher sees them.
///
/// Arrays met before the last component are traversed (each document element is searched for the
/// rest of the path; a numeric component also indexes the array). Each place where the path ends
/// without a value yields `None` (missing). The last value is returned as is, even if it is an
/// array: the caller decides whether to look at its elements.
pub fn query_leaves<'a>(doc: &'a Document, path: &str) -> Vec<Option<&'a Bson>> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    walk_doc(doc, &parts, &mut out);
    if out.is_empty() {
        out.push(None);
    }
    out
}

fn walk_doc<'a>(doc: &'a Document, parts: &[&str], out: &mut Vec<Option<&'a Bson>>) {
    match doc.get(parts[0]) {
        Some(v) => walk_value(v, &parts[1..], out),
        None => out.push(None),
    }
}

fn walk_value<'a>(value: &'a Bson, rest: &[&str], out: &mut Vec<Option<&'a Bson>>) {
    if rest.is_empty() {
        out.push(Some(value));
        return;
    }
    match value {
        Bson::Document(d) => walk_doc(d, rest, out),
        Bson::Array(arr) => {
            if let Some(i) = array_index(rest[0]) {
                if let Some(el) = arr.get(i) {
                    walk_value(el, &rest[1..], out);
                }
            }
            for el in arr {
                if let Bson::Document(d) = el {
                    walk_doc(d, rest, out);
                }
            }
        }
        _ => out.push(None),
    }
}

/// Looks a path up without traversing arrays implicitly: a numeric component indexes an array.
/// Used by update operators, which address one place in the document.
pub fn get_exact<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    let mut cur = doc.get(first)?;
    for p in parts {
        cur = match cur {
            Bson::Document(d) => d.get(p)?,
            Bson::Array(a) => a.get(array_index(p)?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Evaluates an aggregation field path (`a.b` of `"$a.b"`) against a value: documents are
/// descended into; arrays map the rest of the path over their elements (dropping elements where
/// it is missing), so `"$a.b"` over `{a: [{b: 1}, {b: 2}]}` is `[1, 2]`. Numeric components are
/// field names, never array indexes. `None` = missing.
pub fn expr_path(value: &Bson, parts: &[&str]) -> Option<Bson> {
    if parts.is_empty() {
        return Some(value.clone());
    }
    match value {
        Bson::Document(d) => expr_path(d.get(parts[0])?, &parts[1..]),
        Bson::Array(arr) => {
            let mut out = Vec::new();
            for el in arr {
                match el {
                    Bson::Document(_) | Bson::Array(_) => {
                        if let Some(v) = expr_path(el, parts) {
                            out.push(v);
                        }
                    }
                    _ => {}
                }
            }
            Some(Bson::Array(out))
        }
        _ => None,
    }
}

/// [`expr_path`] starting from a document.
pub fn expr_path_doc(doc: &Document, path: &str) -> Option<Bson> {
    let parts: Vec<&str> = path.split('.').collect();
    expr_path(doc.get(parts[0])?, &parts[1..])
}

/// Sets `path` to `value` the way `$addFields`/`$set` stages do: missing or non-document
/// intermediate fields become documents; an array on the way applies the rest of the path to
/// each of its elements (non-document elements are replaced by a document).
pub fn set_agg_path(doc: &mut Document, parts: &[&str], value: Bson) {
    if parts.len() == 1 {
        doc.insert(parts[0], value);
        return;
    }
    let entry = doc.get_mut(parts[0]);
    match entry {
        Some(Bson::Document(sub)) => set_agg_path(sub, &parts[1..], value),
        Some(Bson::Array(arr)) => {
            for el in arr.iter_mut() {
                set_agg_in_value(el, &parts[1..], value.clone());
            }
        }
        _ => {
            let mut sub = Document::new();
            set_agg_path(&mut sub, &parts[1..], value);
            doc.insert(parts[0], sub);
        }
    }
}

fn set_agg_in_value(el: &mut Bson, parts: &[&str], value: Bson) {
    match el {
        Bson::Document(d) => set_agg_path(d, parts, value),
        Bson::Array(arr) => {
            for e in arr.iter_mut() {
                set_agg_in_value(e, parts, value.clone());
            }
        }
        other => {
            let mut sub = Document::new();
            set_agg_path(&mut sub, parts, value);
            *other = Bson::Document(sub);
        }
    }
}

/// Removes `path` the way exclusion projections and `$unset` stages do: through arrays, the rest
/// of the path is removed from each document element.
pub fn remove_agg_path(doc: &mut Document, parts: &[&str]) {
    if parts.len() == 1 {
        doc.remove(parts[0]);
        return;
    }
    match doc.get_mut(parts[0]) {
        Some(Bson::Document(sub)) => remove_agg_path(sub, &parts[1..]),
        Some(Bson::Array(arr)) => remove_in_array(arr, &parts[1..]),
        _ => {}
    }
}

fn remove_in_array(arr: &mut [Bson], parts: &[&str]) {
    for el in arr.iter_mut() {
        match el {
            Bson::Document(d) => remove_agg_path(d, parts),
            Bson::Array(inner) => remove_in_array(inner, parts),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn leaves_through_arrays() {
        let d = doc! {"a": [{"b": 1}, {"c": 2}, 5, {"b": [3, 4]}]};
        let l = query_leaves(&d, "a.b");
        assert_eq!(
            l,
            vec![
                Some(&Bson::Int32(1)),
                None,
                Some(&Bson::Array(vec![3.into(), 4.into()]))
            ]
        );
        assert_eq!(query_leaves(&d, "x"), vec![None]);
        assert_eq!(query_leaves(&doc! {"a": 1}, "a.b"), vec![None]);
        let idx = doc! {"a": [10, 20]};
        assert_eq!(query_leaves(&idx, "a.1"), vec![Some(&Bson::Int32(20))]);
        assert_eq!(query_leaves(&doc! {"a": []}, "a.b"), vec![None]);
    }

    #[test]
    fn exact_lookup() {
        let d = doc! {"a": {"b": [1, {"c": 2}]}};
        assert_eq!(get_exact(&d, "a.b.1.c"), Some(&Bson::Int32(2)));
        assert_eq!(get_exact(&d, "a.b.x"), None);
        assert_eq!(get_exact(&d, "a.z"), None);
    }

    #[test]
    fn expression_paths() {
        let d = doc! {"a": [{"b": 1}, {"c": 1}, {"b": 2}, 7], "x": {"y": 3}};
        assert_eq!(
            expr_path_doc(&d, "a.b"),
            Some(Bson::Array(vec![1.into(), 2.into()]))
        );
        assert_eq!(expr_path_doc(&d, "x.y"), Some(Bson::Int32(3)));
        assert_eq!(expr_path_doc(&d, "x.z"), None);
        assert_eq!(expr_path_doc(&d, "a.0"), Some(Bson::Array(vec![])));
    }

    #[test]
    fn agg_set_and_remove() {
        let mut d = doc! {"a": [{"b": 1}, 2], "c": 1};
        set_agg_path(&mut d, &["a", "b"], Bson::Int32(9));
        assert_eq!(d, doc! {"a": [{"b": 9}, {"b": 9}], "c": 1});
        set_agg_path(&mut d, &["c", "d"], Bson::Int32(1));
        assert_eq!(d, doc! {"a": [{"b": 9}, {"b": 9}], "c": {"d": 1}});
        remove_agg_path(&mut d, &["a", "b"]);
        assert_eq!(d, doc! {"a": [{}, {}], "c": {"d": 1}});
    }
}
