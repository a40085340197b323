//! create, drop, dropDatabase, listCollections, createIndexes, listIndexes, dropIndexes.

use bson::{doc, Bson, Document};

use super::args::{self, check_fields};
use super::Ctx;
use crate::engine::matcher::Filter;
use crate::error::{CommandError, CommandResult};
use crate::store::{validate_names, Collection, Index};

/// Options `create` accepts (others are refused by name).
const CREATE_SUPPORTED: &[&str] = &["idIndex"];
/// Options `create` knows but this server does not implement.
const CREATE_UNSUPPORTED: &[&str] = &[
    "capped",
    "size",
    "max",
    "autoIndexId",
    "storageEngine",
    "validator",
    "validationLevel",
    "validationAction",
    "indexOptionDefaults",
    "viewOn",
    "pipeline",
    "collation",
    "timeseries",
    "expireAfterSeconds",
    "clusteredIndex",
    "changeStreamPreAndPostImages",
    "encryptedFields",
    "flags",
];

/// `create`.
pub fn create(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    let coll = args::coll_name(cmd, "create")?;
    validate_names(ctx.db, coll)?;
    let mut options = Document::new();
    for (k, v) in cmd.iter().skip(1) {
        let k = k.as_str();
        if args::GENERIC_FIELDS.contains(&k) {
            continue;
        }
        if CREATE_UNSUPPORTED.contains(&k) {
            // `capped: false` and the like change nothing; anything else is refused.
            if matches!(v, Bson::Boolean(false)) {
                continue;
            }
            return Err(CommandError::bad_value(format!(
                "create option '{k}' is not supported by this server"
            )));
        }
        if !CREATE_SUPPORTED.contains(&k) {
            return Err(args::unknown_field("create", k));
        }
        options.insert(k, v.clone());
    }
    let mut st = ctx.shared.lock();
    if st.store.coll(ctx.db, coll).is_some() {
        return Err(CommandError::new(
            48,
            "NamespaceExists",
            format!("Collection {}.{} already exists.", ctx.db, coll),
        ));
    }
    let counters = st.store.counters.clone();
    st.store
        .dbs
        .entry(ctx.db.to_owned())
        .or_default()
        .colls
        .insert(
            coll.to_owned(),
            Collection::new(ctx.db, coll, options, counters),
        );
    st.clock.tick();
    std::mem::drop(st);
    Ok(args::with_write_concern_error(ctx, cmd, Document::new()))
}

/// `drop`.
pub fn drop(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "drop", &[])?;
    let coll = args::coll_name(cmd, "drop")?;
    let ns = format!("{}.{}", ctx.db, coll);
    let dropped = ctx.shared.lock().drop_collection(ctx.db, coll);
    // MongoDB 7.0: dropping a collection that does not exist succeeds.
    let reply = match dropped {
        Some(n) => doc! {"nIndexesWas": n as i32, "ns": ns},
        None => Document::new(),
    };
    Ok(args::with_write_concern_error(ctx, cmd, reply))
}

/// `dropDatabase`.
pub fn drop_database(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "dropDatabase", &[])?;
    if ctx.db == "admin" || ctx.db == "local" || ctx.db == "config" {
        return Err(CommandError::new(
            20,
            "IllegalOperation",
            format!("Dropping the '{}' database is prohibited.", ctx.db),
        ));
    }
    ctx.shared.lock().drop_database(ctx.db);
    Ok(args::with_write_concern_error(ctx, cmd, Document::new()))
}

/// `listCollections`.
pub fn list_collections(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "listCollections",
        &["filter", "nameOnly", "authorizedCollections", "cursor"],
    )?;
    // `nameOnly` and `authorizedCollections` are of IDL type `bool`
    // (`src/mongo/db/list_collections.idl`): a boolean (null is the default), numbers are
    // code 14.
    let name_only = args::get_strict_bool(cmd, "listCollections", "nameOnly")?.unwrap_or(false);
    args::get_strict_bool(cmd, "listCollections", "authorizedCollections")?;
    let filter = match args::get_doc(cmd, "listCollections", "filter")? {
        Some(f) => Some(Filter::parse(f)?),
        None => None,
    };
    let st = ctx.shared.lock();
    let mut out = Vec::new();
    if let Some(db) = st.store.dbs.get(ctx.db) {
        for (name, c) in &db.colls {
            let entry = if name_only {
                doc! {"name": name.clone(), "type": "collection"}
            } else {
                doc! {
                    "name": name.clone(),
                    "type": "collection",
                    "options": c.options.clone(),
                    "info": {"readOnly": false, "uuid": c.uuid},
                    "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"},
                }
            };
            if let Some(f) = &filter {
                if !f.matches(&entry, &ctx.vars)? {
                    continue;
                }
            }
            out.push(entry);
        }
    }
    Ok(
        doc! {"cursor": {"id": 0i64, "ns": format!("{}.$cmd.listCollections", ctx.db), "firstBatch": out}},
    )
}

/// `listIndexes`.
pub fn list_indexes(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "listIndexes", &["cursor"])?;
    let coll = args::coll_name(cmd, "listIndexes")?;
    let st = ctx.shared.lock();
    let c = st.store.coll(ctx.db, coll).ok_or_else(|| {
        CommandError::new(
            26,
            "NamespaceNotFound",
            format!("ns does not exist: {}.{}", ctx.db, coll),
        )
    })?;
    let specs: Vec<Document> = c.indexes.iter().map(|i| i.spec.clone()).collect();
    Ok(doc! {"cursor": {"id": 0i64, "ns": format!("{}.{}", ctx.db, coll), "firstBatch": specs}})
}

/// Index options this server implements.
const INDEX_OPTIONS: &[&str] = &[
    "key",
    "name",
    "unique",
    "sparse",
    "expireAfterSeconds",
    "partialFilterExpression",
    "background",
    "v",
    "ns",
    "hidden",
    "dropDups",
];
/// Index options mongod knows that this server does not implement.
const INDEX_UNSUPPORTED: &[&str] = &[
    "collation",
    "weights",
    "default_language",
    "language_override",
    "textIndexVersion",
    "2dsphereIndexVersion",
    "bits",
    "min",
    "max",
    "bucketSize",
    "storageEngine",
    "wildcardProjection",
    "clustered",
    "prepareUnique",
];

fn bad_spec(spec: &Document, msg: &str) -> CommandError {
    CommandError::new(
        197,
        "InvalidIndexSpecificationOption",
        format!("{msg} Specification: {}", crate::keys::render_doc(spec)),
    )
}

/// The type checks mongod's `validateIndexSpec` (`src/mongo/db/catalog/index_key_validate.cpp`)
/// makes on the options of a specification, in the order of its fields.
fn check_option_types(spec: &Document) -> CommandResult<()> {
    let type_name = crate::engine::compare::type_name;
    let must_be = |k: &str, what: &str, v: &Bson| {
        Err(CommandError::type_mismatch(format!(
            "The field '{k}' must be {what}, but got {}",
            type_name(v)
        )))
    };
    for (k, v) in spec {
        let number = crate::engine::compare::is_number(v);
        match k.as_str() {
            "key" if !matches!(v, Bson::Document(_)) => return must_be(k, "an object", v),
            "name" if !matches!(v, Bson::String(_)) => return must_be(k, "a string", v),
            "hidden" if !matches!(v, Bson::Boolean(_)) => return must_be(k, "a bool", v),
            "v" => {
                if !number {
                    return must_be(k, "a number", v);
                }
                let as_int = args::as_i64(v)
                    .filter(|i| i32::try_from(*i).is_ok())
                    .filter(|_| match v {
                        Bson::Double(f) => f.fract() == 0.0,
                        _ => true,
                    });
                match as_int {
                    None => {
                        return Err(CommandError::bad_value(format!(
                            "Index version must be representable as a 32-bit integer, but got {}",
                            crate::keys::render(v)
                        )))
                    }
                    // `isIndexVersionAllowedForCreation`: only v1 and v2.
                    Some(1 | 2) => {}
                    Some(other) => {
                        return Err(CommandError::new(
                            67,
                            "CannotCreateIndex",
                            format!(
                            "Invalid index specification {}; cannot create an index with v={other}",
                            crate::keys::render_doc(spec)
                        ),
                        ))
                    }
                }
            }
            "collation" | "partialFilterExpression" if !matches!(v, Bson::Document(_)) => {
                return must_be(k, "an object", v)
            }
            "collation" if v.as_document().is_some_and(Document::is_empty) => {
                return Err(CommandError::bad_value(
                    "The field 'collation' cannot be an empty object.",
                ))
            }
            "weights" if !matches!(v, Bson::Document(_) | Bson::String(_)) => {
                return must_be(k, "an object", v)
            }
            "background" | "unique" | "sparse" | "dropDups" | "prepareUnique" | "clustered"
                if !number && !matches!(v, Bson::Boolean(_)) =>
            {
                return Err(CommandError::type_mismatch(format!(
                    "The field '{k} has value {k}: {}, which is not convertible to bool",
                    crate::keys::render(v)
                )));
            }
            "default_language" | "language_override" if !matches!(v, Bson::String(_)) => {
                return must_be(k, "a string", v)
            }
            "textIndexVersion" | "2dsphereIndexVersion" | "bits" | "min" | "max" if !number => {
                return must_be(k, "a number", v)
            }
            _ => {}
        }
    }
    Ok(())
}

/// Parses and validates one index specification.
fn parse_index(spec: &Document) -> CommandResult<Index> {
    // Unknown fields first, as `validateIndexSpecFieldNames`.
    for (k, _) in spec {
        if !INDEX_OPTIONS.contains(&k.as_str()) && !INDEX_UNSUPPORTED.contains(&k.as_str()) {
            return Err(bad_spec(
                spec,
                &format!("The field '{k}' is not valid for an index specification."),
            ));
        }
    }
    check_option_types(spec)?;
    for (k, v) in spec {
        if INDEX_UNSUPPORTED.contains(&k.as_str()) {
            if k == "collation" {
                if let Bson::Document(c) = v {
                    if c.get_str("locale").ok() == Some("simple") {
                        continue;
                    }
                }
            }
            return Err(CommandError::new(
                67,
                "CannotCreateIndex",
                format!("index option '{k}' is not supported by this server"),
            ));
        }
    }
    let key = match spec.get("key") {
        Some(Bson::Document(k)) if !k.is_empty() => k.clone(),
        Some(Bson::Document(_)) => {
            return Err(CommandError::new(
                67,
                "CannotCreateIndex",
                "Index keys cannot be empty.",
            ))
        }
        _ => {
            return Err(CommandError::failed_to_parse(
                "The 'key' field is a required property of an index specification",
            ))
        }
    };
    for (field, dir) in &key {
        match dir {
            Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => {
                if args::as_i64(dir) == Some(0) {
                    return Err(CommandError::new(
                        67,
                        "CannotCreateIndex",
                        format!("Values in the index key pattern can't be all zero; found {{ {field}: 0 }}"),
                    ));
                }
            }
            Bson::String(kind) => {
                return Err(CommandError::new(
                    67,
                    "CannotCreateIndex",
                    format!("'{kind}' indexes are not supported by this server"),
                ))
            }
            other => {
                return Err(CommandError::new(
                    67,
                    "CannotCreateIndex",
                    format!("Values in v:2 index key pattern cannot be of type {other}. Only numbers > 0, numbers < 0, and strings are allowed."),
                ))
            }
        }
        if field.is_empty() || field.starts_with('$') {
            return Err(CommandError::new(
                67,
                "CannotCreateIndex",
                format!("Index key contains an illegal field name: '{field}'"),
            ));
        }
    }
    let name = match spec.get("name") {
        Some(Bson::String(n)) if !n.is_empty() => n.clone(),
        Some(Bson::String(_)) => {
            return Err(CommandError::new(
                67,
                "CannotCreateIndex",
                "index name cannot be empty",
            ))
        }
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "The field 'name' must be a string",
            ))
        }
        None => {
            return Err(CommandError::failed_to_parse(
                "The 'name' field is a required property of an index specification",
            ))
        }
    };
    let flag = |f: &str| -> CommandResult<bool> {
        match spec.get(f) {
            None => Ok(false),
            Some(Bson::Boolean(b)) => Ok(*b),
            Some(v) => args::as_i64(v).map(|i| i != 0).ok_or_else(|| {
                CommandError::type_mismatch(format!("The field '{f}' must be a boolean"))
            }),
        }
    };
    let unique = flag("unique")?;
    let sparse = flag("sparse")?;
    if flag("hidden")? {
        return Err(CommandError::new(
            67,
            "CannotCreateIndex",
            "hidden indexes are not supported by this server",
        ));
    }
    let is_id = key.len() == 1 && key.contains_key("_id");
    if is_id {
        for bad in [
            "unique",
            "sparse",
            "expireAfterSeconds",
            "partialFilterExpression",
        ] {
            if spec.contains_key(bad) && !(bad == "unique" && unique) {
                return Err(bad_spec(
                    spec,
                    &format!("The field '{bad}' is not valid for an _id index specification."),
                ));
            }
        }
    }
    let ttl = match spec.get("expireAfterSeconds") {
        None => None,
        Some(v) => {
            let secs = match v {
                Bson::Double(f) if f.is_finite() => Some(*f as i64),
                other => args::as_i64(other),
            };
            match secs {
                Some(s) if (0..=i64::from(i32::MAX)).contains(&s) => {}
                Some(_) => {
                    return Err(CommandError::new(
                        67,
                        "CannotCreateIndex",
                        "TTL index 'expireAfterSeconds' option must be within an acceptable range, try a lower number",
                    ))
                }
                None => {
                    return Err(CommandError::new(
                        67,
                        "CannotCreateIndex",
                        format!("TTL index 'expireAfterSeconds' option must be numeric, but received a type of '{v}'"),
                    ))
                }
            }
            if key.len() > 1 {
                return Err(CommandError::new(
                    67,
                    "CannotCreateIndex",
                    "TTL indexes are single-field indexes, compound indexes do not support TTL",
                ));
            }
            secs
        }
    };
    let partial = match spec.get("partialFilterExpression") {
        None => None,
        Some(Bson::Document(p)) => {
            let filter = Filter::parse(p)?;
            check_partial_filter(p).map_err(|expr| {
                CommandError::new(
                    67,
                    "CannotCreateIndex",
                    format!("unsupported expression in partial index: {expr}"),
                )
            })?;
            Some((p.clone(), filter))
        }
        Some(_) => {
            return Err(CommandError::type_mismatch(
                "The field 'partialFilterExpression' must be an object",
            ))
        }
    };
    // The specification as listIndexes shows it: v, key, name, then the options.
    let mut shown = doc! {"v": 2, "key": key.clone(), "name": name.clone()};
    for (k, v) in spec {
        if !matches!(
            k.as_str(),
            "v" | "key" | "name" | "ns" | "background" | "dropDups"
        ) {
            shown.insert(k.clone(), v.clone());
        }
    }
    if let Some(secs) = ttl {
        // Stored as an int, a fractional value truncated (as MongoDB 7.3 and later store it).
        shown.insert(
            "expireAfterSeconds",
            i32::try_from(secs)
                .map(Bson::Int32)
                .unwrap_or(Bson::Int64(secs)),
        );
    }
    Ok(Index::new(name, key, unique, sparse, ttl, partial, shown))
}

/// What a partial index filter may use (MongoDB 7.0): equalities, `$exists: true`, `$gt`,
/// `$gte`, `$lt`, `$lte`, `$type`, `$in`, and `$and`/`$or` of those. Anything else (`$ne`,
/// `$regex`, `$expr`, `$not`, `$exists: false`, ...) is answered with the rendered expression.
fn check_partial_filter(filter: &Document) -> Result<(), String> {
    let render = |path: &str, op: &str, v: &Bson| format!("{path} {op} {}", crate::keys::render(v));
    for (k, v) in filter {
        match (k.as_str(), v) {
            ("$and" | "$or", Bson::Array(items)) => {
                for item in items {
                    if let Bson::Document(d) = item {
                        check_partial_filter(d)?;
                    }
                }
            }
            (op, _) if op.starts_with('$') => return Err(render("", op, v)),
            (path, Bson::Document(d)) if d.keys().next().is_some_and(|o| o.starts_with('$')) => {
                for (op, arg) in d {
                    let ok = match op.as_str() {
                        "$eq" | "$gt" | "$gte" | "$lt" | "$lte" => {
                            !matches!(arg, Bson::RegularExpression(_))
                        }
                        "$type" => true,
                        "$exists" => crate::engine::expr::truthy(Some(arg)),
                        "$in" => match arg {
                            Bson::Array(a) => {
                                !a.iter().any(|x| matches!(x, Bson::RegularExpression(_)))
                            }
                            _ => false,
                        },
                        _ => false,
                    };
                    if !ok {
                        return Err(render(path, op, arg));
                    }
                }
            }
            (path, Bson::RegularExpression(_)) => return Err(render(path, "regex", v)),
            _ => {}
        }
    }
    Ok(())
}

/// How a requested index compares with an existing one, as mongod's
/// `IndexDescriptor::compareIndexOptions` (`src/mongo/db/index/index_descriptor.cpp`).
#[derive(Debug, PartialEq)]
enum Comparison {
    /// The key pattern or an identifying option (unique, sparse, collation, partial filter)
    /// differs: both may exist, under different names.
    Different,
    /// Same key and identifying options, other options differ: they cannot coexist.
    Equivalent,
    /// The same index.
    Identical,
}

fn compare_indexes(requested: &Index, existing: &Index) -> Comparison {
    use crate::engine::compare::values_equal;
    let same_fields = |a: &[(String, Bson)], b: &[(String, Bson)]| {
        a.len() == b.len()
            && a.iter()
                .zip(b.iter())
                .all(|((ka, va), (kb, vb))| ka == kb && values_equal(va, vb))
    };
    let pairs = |d: &Document| -> Vec<(String, Bson)> {
        d.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    if !same_fields(&pairs(&requested.key), &pairs(&existing.key)) {
        return Comparison::Different;
    }
    // The `_id` index is always unique.
    let is_id = |i: &Index| i.key.len() == 1 && i.key.contains_key("_id");
    if (requested.unique || is_id(requested)) != (existing.unique || is_id(existing))
        || requested.sparse != existing.sparse
    {
        return Comparison::Different;
    }
    let partial = |i: &Index| i.partial.as_ref().map(|p| canonical_filter(&p.0));
    if partial(requested) != partial(existing) {
        return Comparison::Different;
    }
    // The other options, compared as mongod's `populateOptionsMapForEqualityCheck` does
    // (by name, ignoring the version, creation-time and separately checked fields).
    let others = |spec: &Document| {
        let mut m: Vec<(String, Bson)> = pairs(spec)
            .into_iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "key"
                        | "ns"
                        | "name"
                        | "v"
                        | "textIndexVersion"
                        | "2dsphereIndexVersion"
                        | "background"
                        | "dropDups"
                        | "collation"
                        | "partialFilterExpression"
                        | "unique"
                        | "sparse"
                        | "wildcardProjection"
                )
            })
            .collect();
        m.sort_by(|a, b| a.0.cmp(&b.0));
        m
    };
    if same_fields(&others(&requested.spec), &others(&existing.spec)) {
        Comparison::Identical
    } else {
        Comparison::Equivalent
    }
}

/// A partial filter as a sorted list of its conditions, so that filters MongoDB considers
/// equivalent — `{a: 1, b: 2}`, `{b: 2, a: {$eq: 1}}`, `{$and: [{a: 1.0}, {b: 2}]}` — are
/// recognised as the same.
fn canonical_filter(filter: &Document) -> Vec<String> {
    let value = |v: &Bson| format!("{:?}", crate::keys::key_of(v));
    let mut out = Vec::new();
    for (k, v) in filter {
        match (k.as_str(), v) {
            ("$and", Bson::Array(items)) => {
                for item in items.iter().filter_map(Bson::as_document) {
                    out.extend(canonical_filter(item));
                }
            }
            ("$or", Bson::Array(items)) => {
                let mut branches: Vec<String> = items
                    .iter()
                    .filter_map(Bson::as_document)
                    .map(|d| canonical_filter(d).join("&"))
                    .collect();
                branches.sort();
                branches.dedup();
                out.push(format!("$or({})", branches.join("|")));
            }
            (path, Bson::Document(ops))
                if ops.keys().next().is_some_and(|o| o.starts_with('$')) =>
            {
                for (op, arg) in ops {
                    out.push(format!("{path} {op} {}", value(arg)));
                }
            }
            (path, v) => out.push(format!("{path} $eq {}", value(v))),
        }
    }
    out.sort();
    out.dedup();
    out
}

/// `createIndexes`.
pub fn create_indexes(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(
        cmd,
        "createIndexes",
        &["indexes", "commitQuorum", "ignoreUnknownIndexOptions"],
    )?;
    let coll = args::coll_name(cmd, "createIndexes")?;
    validate_names(ctx.db, coll)?;
    let specs = args::get_docs(cmd, "createIndexes", "indexes")?;
    if specs.is_empty() {
        return Err(CommandError::bad_value(
            "Must specify at least one index to create",
        ));
    }
    let mut parsed = Vec::with_capacity(specs.len());
    for s in &specs {
        parsed.push(parse_index(s)?);
    }
    let mut st = ctx.shared.lock();
    let (c, created) = st.store.coll_or_create(ctx.db, coll)?;
    let before = c.indexes.len();
    let mut to_add = Vec::new();
    for index in parsed {
        // As mongod's `IndexCatalogImpl::_doesSpecConflictWithExisting`
        // (`src/mongo/db/catalog/index_catalog_impl.cpp`): an index of the same name must be
        // identical (86 IndexKeySpecsConflict when its key or an identifying option differs,
        // 85 IndexOptionsConflict when another option does); an index of another name must not
        // have the same key and identifying options (85).
        let render = |i: &Index| crate::keys::render_doc(&i.spec);
        let mut exists = false;
        if let Some(existing) = c
            .indexes
            .iter()
            .chain(to_add.iter())
            .find(|e| e.name == index.name)
        {
            match compare_indexes(&index, existing) {
                Comparison::Different => {
                    return Err(CommandError::new(
                        86,
                        "IndexKeySpecsConflict",
                        format!(
                            "An existing index has the same name as the requested index. When index names are not specified, they are auto generated and can cause conflicts. Please refer to our documentation. Requested index: {}, existing index: {}",
                            render(&index),
                            render(existing)
                        ),
                    ))
                }
                Comparison::Equivalent => {
                    return Err(CommandError::new(
                        85,
                        "IndexOptionsConflict",
                        format!(
                            "An equivalent index already exists with the same name but different options. Requested index: {}, existing index: {}",
                            render(&index),
                            render(existing)
                        ),
                    ))
                }
                Comparison::Identical => exists = true,
            }
        } else if let Some((existing, cmp)) = c
            .indexes
            .iter()
            .chain(to_add.iter())
            .map(|e| (e, compare_indexes(&index, e)))
            .find(|(_, cmp)| *cmp != Comparison::Different)
        {
            let msg = if cmp == Comparison::Identical {
                format!(
                    "Index already exists with a different name: {}",
                    existing.name
                )
            } else {
                format!(
                    "An equivalent index already exists with a different name and options. Requested index: {}, existing index: {}",
                    render(&index),
                    render(existing)
                )
            };
            return Err(CommandError::new(85, "IndexOptionsConflict", msg));
        }
        if !exists {
            to_add.push(index);
        }
    }
    if to_add.len() + before > 64 {
        return Err(CommandError::new(
            67,
            "CannotCreateIndex",
            "add index fails, too many indexes (64 max)",
        ));
    }
    let added = to_add.len();
    for index in to_add {
        c.add_index(index, &ctx.vars)?;
    }
    let after = c.indexes.len();
    if created || added > 0 {
        st.clock.tick();
    }
    std::mem::drop(st);
    let mut reply = doc! {
        "numIndexesBefore": before as i32,
        "numIndexesAfter": after as i32,
        "createdCollectionAutomatically": created,
    };
    if added == 0 {
        reply.insert("note", "all indexes already exist");
    }
    Ok(args::with_write_concern_error(ctx, cmd, reply))
}

fn index_not_found(what: String) -> CommandError {
    CommandError::new(27, "IndexNotFound", what)
}

fn cannot_drop_id_index() -> CommandError {
    CommandError::new(72, "InvalidOptions", "cannot drop _id index")
}

/// The position of the index `name` that `dropIndexes` may drop (not `_id_`).
fn droppable_index_named(indexes: &[Index], name: &str) -> CommandResult<usize> {
    if name == "_id_" {
        return Err(cannot_drop_id_index());
    }
    indexes
        .iter()
        .position(|i| i.name == name)
        .ok_or_else(|| index_not_found(format!("index not found with name [{name}]")))
}

/// `dropIndexes`.
pub fn drop_indexes(ctx: &Ctx<'_>, cmd: &Document) -> CommandResult<Document> {
    check_fields(cmd, "dropIndexes", &["index"])?;
    let coll = args::coll_name(cmd, "dropIndexes")?;
    let mut st = ctx.shared.lock();
    let c = st.store.coll_mut(ctx.db, coll).ok_or_else(|| {
        CommandError::new(
            26,
            "NamespaceNotFound",
            format!("ns not found {}.{}", ctx.db, coll),
        )
    })?;
    let was = c.indexes.len() as i32;
    match cmd.get("index") {
        Some(Bson::String(s)) if s == "*" => {
            c.indexes.truncate(1);
        }
        Some(Bson::String(name)) => {
            let i = droppable_index_named(&c.indexes, name)?;
            c.remove_index(i);
        }
        Some(Bson::Array(names)) => {
            let mut positions = Vec::new();
            for n in names {
                let Bson::String(name) = n else {
                    return Err(CommandError::type_mismatch("index names must be strings"));
                };
                positions.push(droppable_index_named(&c.indexes, name)?);
            }
            positions.sort_unstable();
            positions.dedup();
            for i in positions.into_iter().rev() {
                c.remove_index(i);
            }
        }
        Some(Bson::Document(key)) => {
            let i = c
                .indexes
                .iter()
                .position(|i| &i.key == key)
                .ok_or_else(|| {
                    index_not_found(format!(
                        "can't find index with key: {}",
                        crate::keys::render_doc(key)
                    ))
                })?;
            if i == 0 {
                return Err(cannot_drop_id_index());
            }
            c.remove_index(i);
        }
        _ => {
            return Err(CommandError::new(
                40414,
                "Location40414",
                "BSON field 'dropIndexes.index' is missing but a required field",
            ))
        }
    }
    st.clock.tick();
    std::mem::drop(st);
    Ok(args::with_write_concern_error(
        ctx,
        cmd,
        doc! {"nIndexesWas": was},
    ))
}
