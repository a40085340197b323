use super::*;
use bson::{doc, DateTime};

fn vars() -> Vars {
    Vars::new(DateTime::from_millis(42))
}

fn docs() -> Vec<Document> {
    vec![
        doc! {"_id": 1, "x": 3, "g": "a", "tags": ["p", "q"]},
        doc! {"_id": 2, "x": 1, "g": "b", "tags": []},
        doc! {"_id": 3, "x": 2, "g": "a"},
    ]
}

fn r(stages: Vec<Document>) -> Vec<Document> {
    run(&stages, docs(), &vars()).unwrap_or_else(|e| panic!("{e}"))
}

fn rerr(stages: Vec<Document>) -> CommandError {
    match run(&stages, docs(), &vars()) {
        Ok(v) => panic!("expected error, got {v:?}"),
        Err(e) => e,
    }
}

fn ids(v: &[Document]) -> Vec<i32> {
    v.iter().filter_map(|d| d.get_i32("_id").ok()).collect()
}

#[test]
fn match_sort_skip_limit() {
    assert_eq!(ids(&r(vec![doc! {"$match": {"g": "a"}}])), vec![1, 3]);
    assert_eq!(ids(&r(vec![doc! {"$sort": {"x": 1}}])), vec![2, 3, 1]);
    assert_eq!(ids(&r(vec![doc! {"$sort": {"x": -1}}])), vec![1, 3, 2]);
    assert_eq!(
        ids(&r(vec![doc! {"$sort": {"g": 1, "x": -1}}])),
        vec![1, 3, 2]
    );
    assert_eq!(
        ids(&r(vec![
            doc! {"$sort": {"x": 1}},
            doc! {"$skip": 1},
            doc! {"$limit": 1}
        ])),
        vec![3]
    );
    assert_eq!(ids(&r(vec![doc! {"$skip": 10}])), Vec::<i32>::new());
    assert_eq!(rerr(vec![doc! {"$limit": 0}]).code, 15958);
    assert_eq!(rerr(vec![doc! {"$skip": -1}]).code, 5107200);
    assert_eq!(rerr(vec![doc! {"$sort": {"x": 2}}]).code, 15975);
    assert_eq!(rerr(vec![doc! {"$sort": {}}]).code, 15976);
    assert_eq!(rerr(vec![doc! {"$match": {"$bogus": 1}}]).code, 2);
}

#[test]
fn sort_semantics() {
    let mut v = vec![
        doc! {"_id": 1, "a": [5, 1]},
        doc! {"_id": 2, "a": 3},
        doc! {"_id": 3},
        doc! {"_id": 4, "a": "s"},
        doc! {"_id": 5, "a": Bson::Null},
        doc! {"_id": 6, "a": []},
    ];
    assert!(sort_documents(&mut v, &doc! {"a": 1}).is_ok());
    assert_eq!(ids(&v), vec![6, 3, 5, 1, 2, 4]);
    assert!(sort_documents(&mut v, &doc! {"a": -1}).is_ok());
    assert_eq!(ids(&v), vec![4, 1, 2, 3, 5, 6]);
    let mut v = vec![
        doc! {"_id": 1, "a": {"b": 2}},
        doc! {"_id": 2, "a": {"b": 1}},
    ];
    assert!(sort_documents(&mut v, &doc! {"a.b": 1}).is_ok());
    assert_eq!(ids(&v), vec![2, 1]);
    assert!(sort_documents(&mut v, &doc! {"a": {"$meta": "textScore"}}).is_err());
}

#[test]
fn project_count_add_fields_unset() {
    assert_eq!(
        r(vec![
            doc! {"$project": {"x": 1, "_id": 0}},
            doc! {"$limit": 1}
        ]),
        vec![doc! {"x": 3}]
    );
    assert_eq!(r(vec![doc! {"$count": "n"}]), vec![doc! {"n": 3}]);
    assert_eq!(
        r(vec![doc! {"$match": {"x": 99}}, doc! {"$count": "n"}]),
        Vec::<Document>::new()
    );
    assert_eq!(rerr(vec![doc! {"$count": ""}]).code, 40156);
    assert_eq!(rerr(vec![doc! {"$count": "$a"}]).code, 40158);
    let out = r(vec![
        doc! {"$match": {"_id": 3}},
        doc! {"$set": {"y": {"$multiply": ["$x", 10]}, "n.m": 1, "g": "$$REMOVE"}},
    ]);
    assert_eq!(out, vec![doc! {"_id": 3, "x": 2, "y": 20, "n": {"m": 1}}]);
    let out = run(
        &[doc! {"$addFields": {"specs": {"fuel": "unleaded"}}}],
        vec![doc! {"_id": 1, "specs": {"doors": 4}}],
        &vars(),
    );
    assert_eq!(
        out.ok(),
        Some(vec![
            doc! {"_id": 1, "specs": {"doors": 4, "fuel": "unleaded"}}
        ])
    );
    assert_eq!(
        r(vec![doc! {"$match": {"_id": 3}}, doc! {"$unset": "x"}]),
        vec![doc! {"_id": 3, "g": "a"}]
    );
    assert_eq!(
        r(vec![
            doc! {"$match": {"_id": 3}},
            doc! {"$unset": ["x", "g"]}
        ]),
        vec![doc! {"_id": 3}]
    );
    assert_eq!(rerr(vec![doc! {"$unset": 1}]).code, 31002);
}

#[test]
fn replace_root() {
    let out = run(
        &[doc! {"$replaceRoot": {"newRoot": "$inner"}}],
        vec![doc! {"_id": 1, "inner": {"a": 1}}],
        &vars(),
    );
    assert_eq!(out.ok(), Some(vec![doc! {"a": 1}]));
    let out = run(
        &[doc! {"$replaceWith": {"k": "$_id"}}],
        vec![doc! {"_id": 1}],
        &vars(),
    );
    assert_eq!(out.ok(), Some(vec![doc! {"k": 1}]));
    assert_eq!(rerr(vec![doc! {"$replaceWith": "$nope"}]).code, 40228);
    assert_eq!(rerr(vec![doc! {"$replaceRoot": {}}]).code, 40231);
}

#[test]
fn group_and_unwind() {
    let out = r(vec![
        doc! {"$group": {"_id": "$g", "n": {"$sum": 1}, "total": {"$sum": "$x"}, "max": {"$max": "$x"}, "xs": {"$push": "$x"}, "c": {"$count": {}}}},
        doc! {"$sort": {"_id": 1}},
    ]);
    assert_eq!(
        out,
        vec![
            doc! {"_id": "a", "n": 2, "total": 5, "max": 3, "xs": [3, 2], "c": 2},
            doc! {"_id": "b", "n": 1, "total": 1, "max": 1, "xs": [1], "c": 1},
        ]
    );
    let out = r(vec![
        doc! {"$group": {"_id": Bson::Null, "avg": {"$avg": "$x"}, "f": {"$first": "$_id"}, "s": {"$addToSet": "$g"}}},
    ]);
    assert_eq!(
        out,
        vec![doc! {"_id": Bson::Null, "avg": 2.0, "f": 1, "s": ["a", "b"]}]
    );
    assert_eq!(rerr(vec![doc! {"$group": {"n": {"$sum": 1}}}]).code, 15955);
    assert_eq!(
        rerr(vec![doc! {"$group": {"_id": 1, "n": {"$median": 1}}}]).code,
        15952
    );
    let out = r(vec![doc! {"$unwind": "$tags"}]);
    assert_eq!(
        out,
        vec![
            doc! {"_id": 1, "x": 3, "g": "a", "tags": "p"},
            doc! {"_id": 1, "x": 3, "g": "a", "tags": "q"}
        ]
    );
    let out = r(vec![
        doc! {"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": true, "includeArrayIndex": "i"}},
    ]);
    assert_eq!(ids(&out), vec![1, 1, 2, 3]);
    assert_eq!(out[1].get("i"), Some(&Bson::Int64(1)));
    assert_eq!(out[2].get("i"), Some(&Bson::Null));
    assert_eq!(rerr(vec![doc! {"$unwind": "tags"}]).code, 28818);
    // A dotted includeArrayIndex writes a nested field.
    let out = r(vec![
        doc! {"$match": {"_id": 1}},
        doc! {"$unwind": {"path": "$tags", "includeArrayIndex": "meta.idx"}},
    ]);
    assert_eq!(
        out[1],
        doc! {"_id": 1, "x": 3, "g": "a", "tags": "q", "meta": {"idx": 1i64}}
    );
}

#[test]
fn unknown_and_malformed_stages() {
    let e = rerr(vec![doc! {"$bogus": {}}]);
    assert_eq!(e.code, 40324);
    assert!(e.message.contains("$bogus"));
    let e = rerr(vec![doc! {"$lookup": {}}]);
    assert!(e.message.contains("$lookup"));
    assert_eq!(rerr(vec![doc! {"$match": {}, "$limit": 1}]).code, 40323);
    assert_eq!(rerr(vec![doc! {}]).code, 40323);
    assert_eq!(rerr(vec![doc! {"$changeStream": {}}]).code, 40602);
}

#[test]
fn update_pipelines() {
    let d = doc! {"_id": 1, "a": 1};
    let out = run_update_pipeline(&[doc! {"$project": {"_id": 0, "a": 1}}], &d, &vars());
    assert_eq!(out.ok(), Some(doc! {"_id": 1, "a": 1}));
    let out = run_update_pipeline(&[doc! {"$set": {"_id": 2}}], &d, &vars());
    assert_eq!(out.map_err(|e| e.code), Err(66));
    assert_eq!(
        validate_update_pipeline(&[doc! {"$group": {"_id": 1}}]).map_err(|e| e.code),
        Err(72)
    );
    assert!(validate_update_pipeline(&[doc! {"$replaceWith": "$$ROOT"}]).is_ok());
    assert!(validate(&[doc! {"$group": {"_id": 1}}]).is_ok());
}

#[test]
fn element_sort_by_spec() {
    let keys = parse_sort_spec(&doc! {"s": -1}).unwrap_or_default();
    let a = Bson::Document(doc! {"s": 1});
    let b = Bson::Document(doc! {"s": 2});
    assert_eq!(compare_values_by_spec(&a, &b, &keys), Ordering::Greater);
    assert_eq!(
        compare_values_by_spec(&Bson::Int32(5), &b, &keys),
        Ordering::Greater
    );
}
