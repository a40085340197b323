//! Change-stream `updateDescription`s: how `after` differs from `before`.

use bson::{Bson, Document};

/// What an update changed, as a change stream's `updateDescription` reports it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateDescription {
    /// Fields set to a new value, by dotted path (`{"a.b": 1}`).
    pub updated_fields: Document,
    /// Dotted paths of removed fields.
    pub removed_fields: Vec<String>,
    /// Arrays that only lost trailing elements: `{field: "a.b", newSize: 2}`.
    pub truncated_arrays: Vec<Document>,
}

impl UpdateDescription {
    /// The `updateDescription` sub-document of a change event (`disambiguatedPaths` is not
    /// produced).
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        d.insert("updatedFields", self.updated_fields.clone());
        d.insert(
            "removedFields",
            self.removed_fields
                .iter()
                .cloned()
                .map(Bson::String)
                .collect::<Vec<_>>(),
        );
        d.insert(
            "truncatedArrays",
            self.truncated_arrays
                .iter()
                .cloned()
                .map(Bson::Document)
                .collect::<Vec<_>>(),
        );
        d
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.updated_fields.is_empty()
            && self.removed_fields.is_empty()
            && self.truncated_arrays.is_empty()
    }
}

/// Describes `after` relative to `before`: changed fields of sub-documents are reported by
/// dotted path; a changed array is reported whole in `updatedFields`, except an array that only
/// lost trailing elements, which is reported in `truncatedArrays`; fields that disappeared are
/// in `removedFields`. Values are compared exactly (a type change is a change).
pub fn describe_update(before: &Document, after: &Document) -> UpdateDescription {
    let mut out = UpdateDescription::default();
    diff_docs(before, after, "", &mut out);
    out
}

fn join(prefix: &str, k: &str) -> String {
    if prefix.is_empty() {
        k.to_string()
    } else {
        format!("{prefix}.{k}")
    }
}

fn diff_docs(before: &Document, after: &Document, prefix: &str, out: &mut UpdateDescription) {
    for (k, av) in after {
        let path = join(prefix, k);
        match before.get(k) {
            None => {
                out.updated_fields.insert(path, av.clone());
            }
            Some(bv) if bv == av => {}
            Some(Bson::Document(bd)) => match av {
                Bson::Document(ad) => diff_docs(bd, ad, &path, out),
                _ => {
                    out.updated_fields.insert(path, av.clone());
                }
            },
            Some(Bson::Array(ba)) => match av {
                Bson::Array(aa) if aa.len() < ba.len() && ba[..aa.len()] == aa[..] => {
                    let mut t = Document::new();
                    t.insert("field", path);
                    t.insert("newSize", aa.len() as i32);
                    out.truncated_arrays.push(t);
                }
                _ => {
                    out.updated_fields.insert(path, av.clone());
                }
            },
            Some(_) => {
                out.updated_fields.insert(path, av.clone());
            }
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            out.removed_fields.push(join(prefix, k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn flat_changes() {
        let d = describe_update(
            &doc! {"_id": 1, "a": 1, "b": 2, "c": 3},
            &doc! {"_id": 1, "a": 1, "b": 5, "d": 4},
        );
        assert_eq!(d.updated_fields, doc! {"b": 5, "d": 4});
        assert_eq!(d.removed_fields, vec!["c".to_string()]);
        assert!(d.truncated_arrays.is_empty());
    }

    #[test]
    fn nested_documents_use_dotted_paths() {
        let d = describe_update(
            &doc! {"_id": 1, "a": {"b": 1, "c": 2, "e": {"f": 1}}},
            &doc! {"_id": 1, "a": {"b": 9, "d": 1, "e": {"f": 1}}},
        );
        assert_eq!(d.updated_fields, doc! {"a.b": 9, "a.d": 1});
        assert_eq!(d.removed_fields, vec!["a.c".to_string()]);
    }

    #[test]
    fn arrays() {
        let d = describe_update(&doc! {"a": [1, 2, 3]}, &doc! {"a": [1, 2]});
        assert_eq!(d.truncated_arrays, vec![doc! {"field": "a", "newSize": 2}]);
        assert!(d.updated_fields.is_empty());
        let d = describe_update(&doc! {"a": [1, 2]}, &doc! {"a": [1, 2, 3]});
        assert_eq!(d.updated_fields, doc! {"a": [1, 2, 3]});
        let d = describe_update(&doc! {"a": [1, 2]}, &doc! {"a": [3]});
        assert_eq!(d.updated_fields, doc! {"a": [3]});
    }

    #[test]
    fn type_changes_and_no_change() {
        let d = describe_update(&doc! {"a": 1}, &doc! {"a": 1.0});
        assert_eq!(d.updated_fields, doc! {"a": 1.0});
        let d = describe_update(&doc! {"a": {"b": 1}}, &doc! {"a": 5});
        assert_eq!(d.updated_fields, doc! {"a": 5});
        let d = describe_update(&doc! {"a": 5}, &doc! {"a": {"b": 1}});
        assert_eq!(d.updated_fields, doc! {"a": {"b": 1}});
        assert!(describe_update(&doc! {"a": 1}, &doc! {"a": 1}).is_empty());
        let doc = describe_update(&doc! {"a": 1}, &doc! {}).to_document();
        assert_eq!(
            doc,
            doc! {"updatedFields": {}, "removedFields": ["a"], "truncatedArrays": []}
        );
    }
}
