//! Object and conversion expression operators (`$getField`, `$setField`, `$unsetField`, `$convert`).

use bson::Bson;

use super::*;

impl Ctx<'_> {
    pub(super) fn convert(&mut self, arg: &Bson) -> R {
        let d = object_arg("$convert", arg, &["input", "to", "onError", "onNull"])?;
        let input = self.eval(required("$convert", d, "input")?)?;
        let to_v = self
            .eval(required("$convert", d, "to")?)?
            .unwrap_or(Bson::Null);
        if is_nullish(input.as_ref()) {
            return match d.get("onNull") {
                Some(e) => self.eval(e),
                None => Ok(Some(Bson::Null)),
            };
        }
        if is_nullish(Some(&to_v)) {
            return Ok(Some(Bson::Null));
        }
        let to = convert::target_name(&to_v)?;
        let input = input.unwrap_or(Bson::Null);
        match convert::convert(&input, to) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == 241 => match d.get("onError") {
                Some(h) => self.eval(h),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    pub(super) fn field_ops(&mut self, op: &str, arg: &Bson) -> R {
        let (field_e, input_e, value_e): (&Bson, Option<&Bson>, Option<&Bson>) = match (op, arg) {
            ("$getField", Bson::String(_)) => (arg, None, None),
            ("$getField", _) => {
                let d = object_arg(op, arg, &["field", "input"])?;
                (required(op, d, "field")?, d.get("input"), None)
            }
            ("$setField", _) => {
                let d = object_arg(op, arg, &["field", "input", "value"])?;
                (
                    required(op, d, "field")?,
                    Some(required(op, d, "input")?),
                    Some(required(op, d, "value")?),
                )
            }
            _ => {
                let d = object_arg(op, arg, &["field", "input"])?;
                (
                    required(op, d, "field")?,
                    Some(required(op, d, "input")?),
                    None,
                )
            }
        };
        let field = match field_e {
            Bson::String(s) if !s.starts_with('$') => s.clone(),
            Bson::Document(d) if d.len() == 1 && d.contains_key("$literal") => {
                match d.get("$literal") {
                    Some(Bson::String(s)) => s.clone(),
                    _ => {
                        return Err(loc(
                            5654602,
                            format!("{op} requires 'field' to evaluate to a constant string"),
                        ))
                    }
                }
            }
            _ => {
                return Err(loc(
                    5654601,
                    format!("{op} requires 'field' to evaluate to a constant string"),
                ))
            }
        };
        if field.contains('\0') {
            return Err(loc(
                9534700,
                format!("{op}: 'field' cannot contain an embedded null byte"),
            ));
        }
        let input = match input_e {
            None => Some(Bson::Document(self.root.clone())),
            Some(e) => self.eval(e)?,
        };
        let input_doc = match input {
            None | Some(Bson::Null) | Some(Bson::Undefined) => {
                return Ok(if op == "$getField" {
                    None
                } else {
                    Some(Bson::Null)
                })
            }
            Some(Bson::Document(d)) => d,
            Some(other) => {
                if op == "$getField" {
                    return Ok(None);
                }
                return Err(loc(
                    4161105,
                    format!(
                        "{op} requires 'input' to evaluate to type Object, found {}",
                        type_name(&other)
                    ),
                ));
            }
        };
        match op {
            "$getField" => Ok(input_doc.get(&field).cloned()),
            "$unsetField" => {
                let mut d = input_doc;
                d.remove(&field);
                Ok(Some(Bson::Document(d)))
            }
            _ => {
                let value = match value_e {
                    Some(e) => self.eval(e)?,
                    None => None,
                };
                let mut d = input_doc;
                match value {
                    Some(v) => {
                        d.insert(field, v);
                    }
                    None => {
                        d.remove(&field);
                    }
                }
                Ok(Some(Bson::Document(d)))
            }
        }
    }
}
