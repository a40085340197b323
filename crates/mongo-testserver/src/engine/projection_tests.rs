use super::*;
use bson::{doc, DateTime};

fn vars() -> Vars {
    Vars::new(DateTime::from_millis(42))
}

fn p(d: Document, spec: Document) -> Document {
    project(&d, &spec, &vars()).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn perr(spec: Document) -> i32 {
    match project(&doc! {"_id": 1}, &spec, &vars()) {
        Ok(d) => panic!("expected error for {spec}, got {d}"),
        Err(e) => e.code,
    }
}

fn sample() -> Document {
    doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}, "arr": [{"x": 1, "y": 2}, {"x": 3}, 5], "s": [1, 2, 3, 4]}
}

#[test]
fn inclusion() {
    assert_eq!(p(sample(), doc! {"a": 1}), doc! {"_id": 1, "a": 1});
    assert_eq!(p(sample(), doc! {"a": true, "_id": 0}), doc! {"a": 1});
    assert_eq!(p(sample(), doc! {"b.c": 1}), doc! {"_id": 1, "b": {"c": 2}});
    assert_eq!(
        p(sample(), doc! {"b": {"d": 1}}),
        doc! {"_id": 1, "b": {"d": 3}}
    );
    assert_eq!(
        p(sample(), doc! {"arr.x": 1}),
        doc! {"_id": 1, "arr": [{"x": 1}, {"x": 3}]}
    );
    assert_eq!(p(sample(), doc! {"zz": 1}), doc! {"_id": 1});
    assert_eq!(p(sample(), doc! {"_id": 1}), doc! {"_id": 1});
    assert_eq!(p(sample(), doc! {"a.q": 1}), doc! {"_id": 1});
    // Document order, not projection order.
    assert_eq!(
        p(sample(), doc! {"b": 1, "a": 1}),
        doc! {"_id": 1, "a": 1, "b": {"c": 2, "d": 3}}
    );
}

#[test]
fn exclusion() {
    assert_eq!(
        p(doc! {"_id": 1, "a": 1, "b": 2}, doc! {"a": 0}),
        doc! {"_id": 1, "b": 2}
    );
    assert_eq!(p(doc! {"_id": 1, "a": 1}, doc! {"_id": 0}), doc! {"a": 1});
    assert_eq!(
        p(sample(), doc! {"b.c": 0, "arr": 0, "s": 0, "_id": 0}),
        doc! {"a": 1, "b": {"d": 3}}
    );
    assert_eq!(
        p(doc! {"arr": [{"x": 1, "y": 2}, 5]}, doc! {"arr.x": 0}),
        doc! {"arr": [{"y": 2}, 5]}
    );
    assert_eq!(
        p(doc! {"_id": 1, "a": 1}, doc! {"a": 0, "_id": 1}),
        doc! {"_id": 1}
    );
}

#[test]
fn mixing_is_refused() {
    assert_eq!(perr(doc! {"a": 1, "b": 0}), 31254);
    assert_eq!(perr(doc! {"a": 0, "b": 1}), 31253);
    assert_eq!(perr(doc! {"a": 0, "b": "$x"}), 31254);
    assert_eq!(perr(doc! {"a": 1, "a.b": 1}), 31249);
    assert_eq!(perr(doc! {"a.b": 1, "a": 1}), 31250);
    // A positional projection of a missing field is an inclusion of nothing.
    assert_eq!(p(doc! {"_id": 1}, doc! {"a.$": 1}), doc! {"_id": 1});
    assert_eq!(perr(doc! {"a": {"$meta": "textScore"}}), 2);
    assert_eq!(perr(doc! {"a": {}}), 51270);
    assert_eq!(perr(doc! {"a": {"$bogus": 1}}), 168);
}

#[test]
fn computed_fields() {
    assert_eq!(
        p(
            sample(),
            doc! {"a": 1, "sum": {"$add": ["$a", "$b.c"]}, "now": "$$NOW"}
        ),
        doc! {"_id": 1, "a": 1, "sum": 3, "now": DateTime::from_millis(42)}
    );
    assert_eq!(
        p(sample(), doc! {"lit": "text", "_id": 0}),
        doc! {"lit": "text"}
    );
    assert_eq!(p(sample(), doc! {"m": "$missing", "_id": 0}), doc! {});
    assert_eq!(p(sample(), doc! {"_id": "$a"}), doc! {"_id": 1});
    assert_eq!(
        p(sample(), doc! {"b.e": {"$literal": 9}, "_id": 0}),
        doc! {"b": {"e": 9}}
    );
}

#[test]
fn slice_and_elem_match() {
    assert_eq!(
        p(
            sample(),
            doc! {"s": {"$slice": 2}, "_id": 0, "a": 0, "b": 0, "arr": 0}
        ),
        doc! {"s": [1, 2]}
    );
    assert_eq!(
        p(doc! {"s": [1, 2, 3]}, doc! {"s": {"$slice": -1}}),
        doc! {"s": [3]}
    );
    assert_eq!(
        p(
            doc! {"s": [1, 2, 3], "t": 1},
            doc! {"s": {"$slice": [1, 1]}}
        ),
        doc! {"s": [2], "t": 1}
    );
    assert_eq!(
        p(
            doc! {"s": [1, 2, 3], "t": 1},
            doc! {"s": {"$slice": [-2, 5]}, "t": 1}
        ),
        doc! {"s": [2, 3], "t": 1}
    );
    assert_eq!(p(doc! {"s": 5}, doc! {"s": {"$slice": 1}}), doc! {"s": 5});
    assert_eq!(perr(doc! {"s": {"$slice": [1, 0]}}), 28724);
    assert_eq!(
        p(sample(), doc! {"arr": {"$elemMatch": {"x": 3}}}),
        doc! {"_id": 1, "arr": [{"x": 3}]}
    );
    assert_eq!(
        p(sample(), doc! {"arr": {"$elemMatch": {"x": 9}}}),
        doc! {"_id": 1}
    );
    assert_eq!(perr(doc! {"a.b": {"$elemMatch": {"x": 9}}}), 31275);
}

#[test]
fn empty_projection_is_identity() {
    assert_eq!(p(sample(), doc! {}), sample());
}

#[test]
fn aggregate_projection() {
    let pr = Projection::parse_aggregate(&doc! {"a": 1});
    assert!(pr.as_ref().is_ok_and(|x| x.is_inclusion()));
    assert!(Projection::parse_aggregate(&doc! {}).is_err());
    let pr = Projection::exclusion_of(&["a".to_string(), "b.c".to_string()]);
    let out = pr.and_then(|x| x.apply(&sample(), &vars()));
    assert_eq!(
        out.ok(),
        Some(
            doc! {"_id": 1, "b": {"d": 3}, "arr": [{"x": 1, "y": 2}, {"x": 3}, 5], "s": [1, 2, 3, 4]}
        )
    );
}

#[test]
fn elem_match_with_operators_tests_the_elements() {
    let d = doc! {"_id": 1, "s": [1, 7, 9], "m": [{"x": 1}, 4, {"x": 5}]};
    assert_eq!(
        p(d.clone(), doc! {"s": {"$elemMatch": {"$gte": 5}}}),
        doc! {"_id": 1, "s": [7]}
    );
    assert_eq!(
        p(d.clone(), doc! {"s": {"$elemMatch": {"$gt": 5, "$lt": 8}}}),
        doc! {"_id": 1, "s": [7]}
    );
    assert_eq!(
        p(d.clone(), doc! {"m": {"$elemMatch": {"x": {"$gt": 2}}}}),
        doc! {"_id": 1, "m": [{"x": 5}]}
    );
    assert_eq!(
        p(d, doc! {"s": {"$elemMatch": {"$gt": 100}}}),
        doc! {"_id": 1}
    );
}

#[test]
fn paths_through_arrays_of_scalars() {
    let d = doc! {"_id": 1, "a": [1, {"b": 2, "c": 3}, [{"b": 4}, 5]], "s": [1, 2]};
    // Inclusion keeps the documents' fields and drops scalars inside the arrays.
    assert_eq!(
        p(d.clone(), doc! {"a.b": 1}),
        doc! {"_id": 1, "a": [{"b": 2}, [{"b": 4}]]}
    );
    assert_eq!(p(d.clone(), doc! {"s.x": 1, "_id": 0}), doc! {"s": []});
    // Exclusion keeps the scalars.
    assert_eq!(
        p(d, doc! {"a.b": 0}),
        doc! {"_id": 1, "a": [1, {"c": 3}, [{}, 5]], "s": [1, 2]}
    );
}

// Cases from mongod's own $elemMatch projection tests.
#[test]
fn elem_match_in_exclusion_projections_and_on_arrays_of_arrays() {
    // With an exclusion, the projection excludes; the $elemMatch field is still reduced.
    assert_eq!(
        p(
            doc! {"_id": 1, "x": {"a": 123}, "d": 456},
            doc! {"x": {"$elemMatch": {"$gt": 2}}, "d": 0, "_id": 0}
        ),
        doc! {}
    );
    assert_eq!(
        p(
            doc! {"_id": 1, "x": [1, 3], "d": 456, "e": 1},
            doc! {"x": {"$elemMatch": {"$gt": 2}}, "d": 0}
        ),
        doc! {"_id": 1, "x": [3], "e": 1}
    );
    // Object conditions see an element that is an array as a document: `{}` matches it.
    assert_eq!(
        p(
            doc! {"_id": 1, "x": ["s", 123, [1, 2, 3], {"a": 1}]},
            doc! {"x": {"$elemMatch": {}}, "_id": 0}
        ),
        doc! {"x": [[1, 2, 3]]}
    );
    assert_eq!(
        p(
            doc! {"_id": 1, "x": [[1, 2], [4, 5]]},
            doc! {"x": {"$elemMatch": {"0": 4}}, "_id": 0}
        ),
        doc! {"x": [[4, 5]]}
    );
}

#[test]
fn positional_projection_keeps_the_element_the_query_selects() {
    let d = doc! {"_id": 1, "g": [80, 85, 90], "items": [{"n": "a"}, {"n": "b", "q": 2}], "o": {"s": [1, 7]}, "x": 1};
    let pm = |proj: Document, query: Document| project_matched(&d, &proj, &query, &vars());
    assert_eq!(
        pm(doc! {"g.$": 1}, doc! {"g": {"$gte": 85}}).unwrap(),
        doc! {"_id": 1, "g": [85]}
    );
    assert_eq!(
        pm(doc! {"items.$": 1, "x": 1}, doc! {"items.n": "b"}).unwrap(),
        doc! {"_id": 1, "items": [{"n": "b", "q": 2}], "x": 1}
    );
    assert_eq!(
        pm(
            doc! {"o.s.$": 1, "_id": 0},
            doc! {"o.s": {"$elemMatch": {"$gt": 5}}}
        )
        .unwrap(),
        doc! {"o": {"s": [7]}}
    );
    // Errors: no matching element, more than one, not at the end, not an inclusion.
    let code = |proj: Document, query: Document| pm(proj, query).unwrap_err().code;
    assert_eq!(code(doc! {"g.$": 1}, doc! {"x": 1}), 51246);
    assert_eq!(code(doc! {"g.$": 1, "items.$": 1}, doc! {"g": 80}), 31276);
    assert_eq!(code(doc! {"items.$.n": 1}, doc! {"items.n": "a"}), 31394);
    assert_eq!(code(doc! {"g.$": 0}, doc! {"g": 80}), 31395);
    assert_eq!(code(doc! {"g.$": "x"}, doc! {"g": 80}), 31308);
    // In a sub-projection as well.
    assert_eq!(code(doc! {"o": {"s.$": 0}}, doc! {"o.s": 7}), 31395);
    assert_eq!(
        code(doc! {"g.$": 1, "o": {"s.$": 1}}, doc! {"g": 80}),
        31276
    );
    assert_eq!(
        pm(doc! {"o": {"s.$": 1}, "_id": 0}, doc! {"o.s": 7}).unwrap(),
        doc! {"o": {"s": [7]}}
    );
    assert_eq!(code(doc! {"g.$": {"$slice": 1}}, doc! {"g": 80}), 31271);
    // Not a find projection.
    assert_eq!(
        Projection::parse_aggregate(&doc! {"g.$": 1})
            .err()
            .map(|e| e.code),
        Some(31324)
    );
}

#[test]
fn positional_projection_takes_the_position_of_the_last_array_matched() {
    let pm =
        |d: Document, proj: Document, query: Document| project_matched(&d, &proj, &query, &vars());
    let ok = |d: Document, proj: Document, query: Document| {
        pm(d.clone(), proj.clone(), query.clone())
            .unwrap_or_else(|e| panic!("{proj} with {query} on {d}: {e}"))
    };
    // The condition is on another array (4.4+).
    let d = doc! {"_id": 1, "a": [1, 2, 3], "b": [10, 20, 30]};
    assert_eq!(
        ok(d.clone(), doc! {"b.$": 1, "_id": 0}, doc! {"a": 2}),
        doc! {"b": [20]}
    );
    // Several arrays: conditions sorted by kind then path, the last one decides (the
    // manual's deans_list example: `grades` comes last).
    let deans =
        doc! {"_id": 8, "activity_ids": [1, 2], "grades": [90, 95], "deans_list": [2021, 2020]};
    assert_eq!(
        ok(
            deans,
            doc! {"deans_list.$": 1},
            doc! {"activity_ids": 1, "grades": 95, "deans_list": 2021}
        ),
        doc! {"_id": 8, "deans_list": [2020]}
    );
    // `a.b.$` where `a` is the array: the first array on the path is projected.
    let docs = doc! {"_id": 2, "a": [{"b": 1, "c": 1}, {"b": 5, "c": 2}]};
    assert_eq!(
        ok(docs.clone(), doc! {"a.b.$": 1}, doc! {"a.b": 5}),
        doc! {"_id": 2, "a": [{"b": 5}]}
    );
    assert_eq!(
        ok(
            docs,
            doc! {"a.$": 1, "_id": 0},
            doc! {"a": {"$elemMatch": {"c": 2}}}
        ),
        doc! {"a": [{"b": 5, "c": 2}]}
    );
    // A path reaching no array is a plain inclusion.
    assert_eq!(
        ok(doc! {"_id": 3, "x": 1}, doc! {"x.$": 1}, doc! {"x": 1}),
        doc! {"_id": 3, "x": 1}
    );
    // Errors: no position recorded (`$or`, negations), or one past the projected array.
    let code = |d: Document, proj: Document, query: Document| match pm(d, proj, query) {
        Ok(r) => panic!("expected an error, got {r}"),
        Err(e) => e.code,
    };
    let d = doc! {"_id": 1, "a": [1, 2, 3], "b": [10]};
    assert_eq!(
        code(
            d.clone(),
            doc! {"a.$": 1},
            doc! {"$or": [{"a": 2}, {"z": 1}]}
        ),
        51246
    );
    assert_eq!(
        code(d.clone(), doc! {"a.$": 1}, doc! {"a": {"$ne": 7}}),
        51246
    );
    assert_eq!(code(d.clone(), doc! {"b.$": 1}, doc! {"a": 3}), 51247);
    // With `$elemMatch` (projection_parser.cpp): 31255 after a positional, 31256 before one;
    // a non-object argument 31274.
    let q = doc! {"a": 3};
    assert_eq!(
        code(
            d.clone(),
            doc! {"a.$": 1, "b": {"$elemMatch": {"$gt": 1}}},
            q.clone()
        ),
        31255
    );
    assert_eq!(
        code(
            d.clone(),
            doc! {"b": {"$elemMatch": {"$gt": 1}}, "a.$": 1},
            q.clone()
        ),
        31256
    );
    assert_eq!(code(d, doc! {"b": {"$elemMatch": 1}}, q), 31274);
}

#[test]
fn slice_applies_after_the_projection_as_mongod() {
    // Exclusion-style (a `$slice` alone): documents of `a` are walked, other elements kept,
    // nested arrays left alone.
    let d = doc! {"_id": 1, "a": [{"b": [1, 2], "c": 1}, 5, [{"b": [3, 4]}]], "z": 1};
    assert_eq!(
        p(d.clone(), doc! {"a.b": {"$slice": 1}}),
        doc! {"_id": 1, "a": [{"b": [1], "c": 1}, 5, [{"b": [3, 4]}]], "z": 1}
    );
    // With an inclusion: the `$slice` path is included too; scalars in `a` are dropped by the
    // inclusion, nested arrays projected (and not sliced).
    assert_eq!(
        p(d.clone(), doc! {"a.b": {"$slice": -1}, "a.c": 1, "_id": 0}),
        doc! {"a": [{"b": [2], "c": 1}, [{"b": [3, 4]}]]}
    );
    assert_eq!(
        p(d.clone(), doc! {"a": {"$slice": 1}, "z": 1}),
        doc! {"_id": 1, "a": [{"b": [1, 2], "c": 1}], "z": 1}
    );
    // `$slice` of a document or a scalar leaves it as it is.
    assert_eq!(
        p(
            doc! {"a": {"b": 1}, "c": 2},
            doc! {"a": {"$slice": 1}, "c": 0}
        ),
        doc! {"a": {"b": 1}}
    );
    // Paths through arrays of documents and scalars.
    let mixed = doc! {"_id": 2, "a": [{"b": 1, "c": 2}, 3, [{"b": 4, "c": 5}, 6], {"c": 7}]};
    assert_eq!(
        p(mixed.clone(), doc! {"a.b": 1, "_id": 0}),
        doc! {"a": [{"b": 1}, [{"b": 4}], {}]}
    );
    assert_eq!(
        p(mixed, doc! {"a.b": 0, "_id": 0}),
        doc! {"a": [{"c": 2}, 3, [{"c": 5}, 6], {"c": 7}]}
    );
}
