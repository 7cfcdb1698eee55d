//! Label and field selectors (`?labelSelector=` / `?fieldSelector=`, R8.6).
//!
//! kube-core can match a structured label selector but cannot parse the string form, and
//! nothing parses field selectors, so both are done here. Error messages follow
//! kube-apiserver's wording because kubectl shows them verbatim to users.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::authorization::v1::{FieldSelectorAttributes, LabelSelectorAttributes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldSelectorRequirement, LabelSelectorRequirement,
};
use serde_json::Value;

/// A selector string that does not parse, or names something unsupported.
///
/// The message is meant for a 400 BadRequest Status as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SelectorError {
    message: String,
}

impl SelectorError {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The message, as kube-apiserver would word it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

// ---------------------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------------------

/// Operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LabelOperator {
    /// `k`
    Exists,
    /// `!k`
    DoesNotExist,
    /// `k=v` or `k==v`
    Equals,
    /// `k!=v`
    NotEquals,
    /// `k in (a,b)`
    In,
    /// `k notin (a,b)`
    NotIn,
    /// `k>n` (integer comparison)
    GreaterThan,
    /// `k<n` (integer comparison)
    LessThan,
}

/// One comma-separated term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelRequirement {
    key: String,
    operator: LabelOperator,
    /// Sorted and deduplicated: `in`/`notin` take a set, and a canonical order makes
    /// `Display` stable.
    values: Vec<String>,
}

impl LabelRequirement {
    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> LabelOperator {
        self.operator
    }

    /// The values (empty for `Exists`/`DoesNotExist`, one for `=`, `!=`, `>`, `<`).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether a label set satisfies this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            LabelOperator::Exists => value.is_some(),
            LabelOperator::DoesNotExist => value.is_none(),
            LabelOperator::Equals | LabelOperator::In => {
                value.is_some_and(|v| self.values.iter().any(|w| w == v))
            }
            // Objects without the key match: "not equal to v" holds vacuously.
            LabelOperator::NotEquals | LabelOperator::NotIn => {
                value.is_none_or(|v| !self.values.iter().any(|w| w == v))
            }
            LabelOperator::GreaterThan | LabelOperator::LessThan => {
                let (Some(actual), Some(bound)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.operator == LabelOperator::GreaterThan {
                    actual > bound
                } else {
                    actual < bound
                }
            }
        }
    }
}

impl fmt::Display for LabelRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.operator {
            LabelOperator::Exists => write!(f, "{}", self.key),
            LabelOperator::DoesNotExist => write!(f, "!{}", self.key),
            LabelOperator::Equals => write!(f, "{}={first}", self.key),
            LabelOperator::NotEquals => write!(f, "{}!={first}", self.key),
            LabelOperator::GreaterThan => write!(f, "{}>{first}", self.key),
            LabelOperator::LessThan => write!(f, "{}<{first}", self.key),
            LabelOperator::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            LabelOperator::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
        }
    }
}

/// A parsed label selector: the conjunction of its requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses the `labelSelector` query syntax (R8.6.1).
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let tokens = lex_labels(input)?;
        let mut parser = LabelParser { tokens, pos: 0 };
        let mut requirements = parser.parse()?;
        // Sorted by key like kube-apiserver, so the canonical string form is stable.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Self { requirements })
    }

    /// Whether this selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[LabelRequirement] {
        &self.requirements
    }

    /// Whether a label set satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Convenience for objects in JSON form: reads `metadata.labels`.
    pub fn matches_object(&self, object: &Value) -> bool {
        if self.is_empty() {
            return true;
        }
        let labels: BTreeMap<String, String> = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&labels)
    }

    /// The selector as SubjectAccessReview `labelSelector` attributes (authorizers that
    /// understand selectors can then allow "list only what matches"). `>`/`<` have no SAR
    /// equivalent, so such terms are left out of `requirements` (the raw selector keeps
    /// them); that only makes the SAR broader, never narrower than the request.
    pub fn to_sar_attributes(&self) -> LabelSelectorAttributes {
        let requirements: Vec<LabelSelectorRequirement> = self
            .requirements
            .iter()
            .filter_map(|r| {
                let operator = match r.operator {
                    LabelOperator::Exists => "Exists",
                    LabelOperator::DoesNotExist => "DoesNotExist",
                    LabelOperator::Equals | LabelOperator::In => "In",
                    LabelOperator::NotEquals | LabelOperator::NotIn => "NotIn",
                    LabelOperator::GreaterThan | LabelOperator::LessThan => return None,
                };
                Some(LabelSelectorRequirement {
                    key: r.key.clone(),
                    operator: operator.to_string(),
                    values: (!r.values.is_empty()).then(|| r.values.clone()),
                })
            })
            .collect();
        LabelSelectorAttributes {
            raw_selector: None,
            requirements: (!requirements.is_empty()).then_some(requirements),
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    In,
    NotIn,
    End,
}

impl Tok {
    /// The literal as it appeared, for "found '…'" messages.
    fn literal(&self) -> &str {
        match self {
            Tok::Ident(s) => s,
            Tok::Not => "!",
            Tok::Eq => "=",
            Tok::DoubleEq => "==",
            Tok::NotEq => "!=",
            Tok::Gt => ">",
            Tok::Lt => "<",
            Tok::Open => "(",
            Tok::Close => ")",
            Tok::Comma => ",",
            Tok::In => "in",
            Tok::NotIn => "notin",
            Tok::End => "",
        }
    }

    /// In value position the keywords are ordinary words (`env in (in,notin)` is legal).
    fn as_value(&self) -> Option<&str> {
        match self {
            Tok::Ident(s) => Some(s),
            Tok::In => Some("in"),
            Tok::NotIn => Some("notin"),
            _ => None,
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | '(' | ')' | ',' | '>' | '<') || c.is_whitespace()
}

fn lex_labels(input: &str) -> Result<Vec<Tok>, SelectorError> {
    let mut tokens = Vec::new();
    let mut chars = input.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let tok = match c {
            '!' | '=' => {
                chars.next();
                if chars.peek() == Some(&'=') {
                    chars.next();
                    if c == '!' { Tok::NotEq } else { Tok::DoubleEq }
                } else if c == '!' {
                    Tok::Not
                } else {
                    Tok::Eq
                }
            }
            '(' | ')' | ',' | '>' | '<' => {
                chars.next();
                match c {
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    ',' => Tok::Comma,
                    '>' => Tok::Gt,
                    _ => Tok::Lt,
                }
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if is_special(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                match word.as_str() {
                    "in" => Tok::In,
                    "notin" => Tok::NotIn,
                    _ => Tok::Ident(word),
                }
            }
        };
        tokens.push(tok);
    }
    tokens.push(Tok::End);
    Ok(tokens)
}

struct LabelParser {
    tokens: Vec<Tok>,
    pos: usize,
}

impl LabelParser {
    fn peek(&self) -> &Tok {
        self.tokens.get(self.pos).unwrap_or(&Tok::End)
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn parse(&mut self) -> Result<Vec<LabelRequirement>, SelectorError> {
        let mut out = Vec::new();
        loop {
            match self.peek() {
                Tok::End => return Ok(out),
                Tok::Ident(_) | Tok::Not => {}
                other => {
                    return Err(SelectorError::new(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        other.literal()
                    )));
                }
            }
            let req = self
                .requirement()
                .map_err(|e| SelectorError::new(format!("unable to parse requirement: {e}")))?;
            out.push(req);
            match self.next() {
                Tok::End => return Ok(out),
                Tok::Comma => match self.peek() {
                    Tok::Ident(_) | Tok::Not => {}
                    other => {
                        return Err(SelectorError::new(format!(
                            "found '{}', expected: identifier after ','",
                            other.literal()
                        )));
                    }
                },
                other => {
                    return Err(SelectorError::new(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.literal()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        if self.peek() == &Tok::Not {
            self.next();
            let key = match self.next() {
                Tok::Ident(k) => k,
                other => {
                    return Err(SelectorError::new(format!(
                        "found '{}', expected: identifier after '!'",
                        other.literal()
                    )));
                }
            };
            return new_requirement(key, LabelOperator::DoesNotExist, Vec::new());
        }
        let key = match self.next() {
            Tok::Ident(k) => k,
            other => {
                return Err(SelectorError::new(format!(
                    "found '{}', expected: identifier",
                    other.literal()
                )));
            }
        };
        if matches!(self.peek(), Tok::End | Tok::Comma) {
            return new_requirement(key, LabelOperator::Exists, Vec::new());
        }
        let operator = match self.next() {
            Tok::Eq | Tok::DoubleEq => LabelOperator::Equals,
            Tok::NotEq => LabelOperator::NotEquals,
            Tok::In => LabelOperator::In,
            Tok::NotIn => LabelOperator::NotIn,
            Tok::Gt => LabelOperator::GreaterThan,
            Tok::Lt => LabelOperator::LessThan,
            other => {
                return Err(SelectorError::new(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    other.literal()
                )));
            }
        };
        let values = match operator {
            LabelOperator::In | LabelOperator::NotIn => self.value_set()?,
            _ => vec![self.exact_value()?],
        };
        new_requirement(key, operator, values)
    }

    fn exact_value(&mut self) -> Result<String, SelectorError> {
        // `k=` (and `k=,j`) selects the empty value.
        if matches!(self.peek(), Tok::End | Tok::Comma) {
            return Ok(String::new());
        }
        let t = self.next();
        match t.as_value() {
            Some(v) => Ok(v.to_string()),
            None => Err(SelectorError::new(format!(
                "found '{}', expected: identifier",
                t.literal()
            ))),
        }
    }

    fn value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        let t = self.next();
        if t != Tok::Open {
            return Err(SelectorError::new(format!(
                "found '{}', expected: '('",
                t.literal()
            )));
        }
        let mut values = Vec::new();
        // Empty items stand for the empty value, so `()`, `(a,)` and `(,a)` are all legal.
        let mut expect_value = true;
        loop {
            let t = self.next();
            match (&t, expect_value) {
                (Tok::Close, _) => {
                    if expect_value {
                        values.push(String::new());
                    }
                    return Ok(values);
                }
                (Tok::Comma, true) => values.push(String::new()),
                (Tok::Comma, false) => expect_value = true,
                (_, true) if t.as_value().is_some() => {
                    values.push(t.as_value().unwrap_or_default().to_string());
                    expect_value = false;
                }
                (_, true) => {
                    return Err(SelectorError::new(format!(
                        "found '{}', expected: ',', ')' or identifier",
                        t.literal()
                    )));
                }
                (_, false) => {
                    return Err(SelectorError::new(format!(
                        "found '{}', expected: ',' or ')'",
                        t.literal()
                    )));
                }
            }
        }
    }
}

fn new_requirement(
    key: String,
    operator: LabelOperator,
    values: Vec<String>,
) -> Result<LabelRequirement, SelectorError> {
    let mut errors = Vec::new();
    let key_errors = qualified_name_errors(&key);
    if !key_errors.is_empty() {
        errors.push(format!(
            "key: Invalid value: {key:?}: {}",
            key_errors.join("; ")
        ));
    }
    let values: Vec<String> = values
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    match operator {
        LabelOperator::GreaterThan | LabelOperator::LessThan => {
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errors.push(format!(
                        "values[{i}]: Invalid value: {v:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                }
            }
        }
        _ => {
            for (i, v) in values.iter().enumerate() {
                let value_errors = label_value_errors(v);
                if !value_errors.is_empty() {
                    errors.push(format!(
                        "values[{i}][{key}]: Invalid value: {v:?}: {}",
                        value_errors.join("; ")
                    ));
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(SelectorError::new(if errors.len() == 1 {
            errors.remove(0)
        } else {
            format!("[{}]", errors.join(", "))
        }));
    }
    Ok(LabelRequirement {
        key,
        operator,
        values,
    })
}

const NAME_FMT_HINT: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const QUALIFIED_NAME_HINT: &str = "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const DNS1123_SUBDOMAIN_HINT: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_VALUE_HINT: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, non-empty.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

/// Problems with a label key (a "qualified name"); empty when valid.
pub fn qualified_name_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                if prefix.len() > 253 {
                    errs.push("prefix part must be no more than 253 characters".to_string());
                }
                if !is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {DNS1123_SUBDOMAIN_HINT}"));
                }
            }
            *name
        }
        _ => return vec![QUALIFIED_NAME_HINT.to_string()],
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > 63 {
            errs.push("name part must be no more than 63 characters".to_string());
        }
        if !is_name_part(name) {
            errs.push(NAME_FMT_HINT.to_string());
        }
    }
    errs
}

/// Problems with a label value; empty when valid.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !value.is_empty() && !is_name_part(value) {
        errs.push(LABEL_VALUE_HINT.to_string());
    }
    errs
}

// ---------------------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------------------

/// Operator of one field requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldOperator {
    /// `f=v` or `f==v`
    Equals,
    /// `f!=v`
    NotEquals,
}

/// One comma-separated term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    field: String,
    operator: FieldOperator,
    value: String,
}

impl FieldRequirement {
    /// The field path, e.g. `metadata.name`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The operator.
    pub fn operator(&self) -> FieldOperator {
        self.operator
    }

    /// The unescaped value.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.operator {
            FieldOperator::Equals => "=",
            FieldOperator::NotEquals => "!=",
        };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A parsed field selector: the conjunction of its requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// The selector that matches every object.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses the `fieldSelector` query syntax (R8.6.2).
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_unescaped_commas(input) {
            if term.is_empty() {
                continue;
            }
            let Some((idx, operator, op_len)) = find_field_operator(term) else {
                return Err(SelectorError::new(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                )));
            };
            let field = term[..idx].to_string();
            let value = unescape_field_value(&term[idx + op_len..])?;
            requirements.push(FieldRequirement {
                field,
                operator,
                value,
            });
        }
        Ok(Self { requirements })
    }

    /// Whether this selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// The distinct field names used, so the server can reject unsupported ones.
    pub fn fields(&self) -> BTreeSet<&str> {
        self.requirements.iter().map(|r| r.field.as_str()).collect()
    }

    /// Fails with kube-apiserver's `field label not supported: <field>` for the first
    /// field not in `supported`.
    pub fn check_supported(&self, supported: &[&str]) -> Result<(), SelectorError> {
        match self
            .requirements
            .iter()
            .find(|r| !supported.contains(&r.field.as_str()))
        {
            Some(r) => Err(SelectorError::new(format!(
                "field label not supported: {}",
                r.field
            ))),
            None => Ok(()),
        }
    }

    /// The value an `=` term demands for `field`, if any; lets the server narrow a list to
    /// one name or namespace before matching.
    pub fn required_value(&self, field: &str) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == field && r.operator == FieldOperator::Equals)
            .map(|r| r.value.as_str())
    }

    /// Whether an object satisfies every requirement; `get` returns a field's value in its
    /// string form. A field the object lacks counts as the empty string, as for CRD
    /// selectable fields.
    pub fn matches(&self, get: &dyn Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let actual = get(&r.field).unwrap_or_default();
            match r.operator {
                FieldOperator::Equals => actual == r.value,
                FieldOperator::NotEquals => actual != r.value,
            }
        })
    }

    /// Convenience for objects in JSON form, resolving fields with [`field_value`].
    pub fn matches_object(&self, object: &Value) -> bool {
        self.matches(&|f| field_value(object, f))
    }

    /// The selector as SubjectAccessReview `fieldSelector` attributes.
    pub fn to_sar_attributes(&self) -> FieldSelectorAttributes {
        let requirements: Vec<FieldSelectorRequirement> = self
            .requirements
            .iter()
            .map(|r| FieldSelectorRequirement {
                key: r.field.clone(),
                operator: match r.operator {
                    FieldOperator::Equals => "In",
                    FieldOperator::NotEquals => "NotIn",
                }
                .to_string(),
                values: Some(vec![r.value.clone()]),
            })
            .collect();
        FieldSelectorAttributes {
            raw_selector: None,
            requirements: (!requirements.is_empty()).then_some(requirements),
        }
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A dotted field path (`status.phase`) of a JSON object as a selector value: strings as
/// is, booleans `true`/`false`, numbers in decimal; objects, arrays and null are `None`.
pub fn field_value(object: &Value, path: &str) -> Option<String> {
    let mut cur = object;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Escapes `\`, `,` and `=` so a value survives a round trip through [`FieldSelector::parse`].
pub fn escape_field_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn split_unescaped_commas(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in input.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            parts.push(&input[start..i]);
            start = i + 1;
        }
    }
    parts.push(&input[start..]);
    parts
}

/// Position, operator and operator length of the first unescaped operator in a term.
fn find_field_operator(term: &str) -> Option<(usize, FieldOperator, usize)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        let rest = &term[i..];
        if rest.starts_with("!=") {
            return Some((i, FieldOperator::NotEquals, 2));
        }
        if rest.starts_with("==") {
            return Some((i, FieldOperator::Equals, 2));
        }
        if rest.starts_with('=') {
            return Some((i, FieldOperator::Equals, 1));
        }
    }
    None
}

fn unescape_field_value(raw: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(SelectorError::new(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    )));
                }
                None => {
                    return Err(SelectorError::new(
                        "invalid field selector: invalid escape sequence: \\",
                    ));
                }
            },
            // A bare `=` in a value is ambiguous (`a=b=c`), so kube-apiserver refuses it.
            '=' | ',' => {
                return Err(SelectorError::new(format!(
                    "invalid field selector: unescaped character in value: {c}"
                )));
            }
            _ => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ls(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn lerr(s: &str) -> String {
        match LabelSelector::parse(s) {
            Ok(sel) => panic!("{s:?} parsed as {sel:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        for s in ["", "   "] {
            let sel = ls(s);
            assert!(sel.is_empty());
            assert!(sel.matches(&labels(&[])));
            assert!(sel.matches(&labels(&[("a", "b")])));
        }
    }

    #[test]
    fn all_operators_parse() {
        let sel = ls("a, !b, c=1, d==2, e!=3, f in (x,y), g notin (z), h>4, i<5");
        let ops: Vec<_> = sel.requirements().iter().map(|r| r.operator()).collect();
        assert_eq!(
            ops,
            vec![
                LabelOperator::Exists,
                LabelOperator::DoesNotExist,
                LabelOperator::Equals,
                LabelOperator::Equals,
                LabelOperator::NotEquals,
                LabelOperator::In,
                LabelOperator::NotIn,
                LabelOperator::GreaterThan,
                LabelOperator::LessThan,
            ]
        );
        assert_eq!(
            sel.to_string(),
            "a,!b,c=1,d=2,e!=3,f in (x,y),g notin (z),h>4,i<5"
        );
    }

    #[test]
    fn whitespace_is_insignificant() {
        assert_eq!(
            ls("  app = web ,tier  in(  a , b )"),
            ls("app=web,tier in (a,b)")
        );
        assert_eq!(ls("! app"), ls("!app"));
    }

    #[test]
    fn requirements_are_sorted_and_values_deduplicated() {
        let sel = ls("z=1,a in (c,b,c)");
        assert_eq!(sel.to_string(), "a in (b,c),z=1");
    }

    #[test]
    fn equality_matching() {
        let sel = ls("app=web");
        assert!(sel.matches(&labels(&[("app", "web"), ("x", "y")])));
        assert!(!sel.matches(&labels(&[("app", "db")])));
        assert!(!sel.matches(&labels(&[])));
        assert!(ls("app==web").matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn inequality_matches_objects_without_the_key() {
        let sel = ls("app!=web");
        assert!(sel.matches(&labels(&[])));
        assert!(sel.matches(&labels(&[("app", "db")])));
        assert!(!sel.matches(&labels(&[("app", "web")])));
        let sel = ls("app notin (web,db)");
        assert!(sel.matches(&labels(&[])));
        assert!(sel.matches(&labels(&[("app", "cache")])));
        assert!(!sel.matches(&labels(&[("app", "db")])));
    }

    #[test]
    fn set_and_existence_matching() {
        let sel = ls("env in (prod, staging)");
        assert!(sel.matches(&labels(&[("env", "prod")])));
        assert!(!sel.matches(&labels(&[("env", "dev")])));
        assert!(!sel.matches(&labels(&[])));
        assert!(ls("env").matches(&labels(&[("env", "")])));
        assert!(!ls("env").matches(&labels(&[])));
        assert!(ls("!env").matches(&labels(&[])));
        assert!(!ls("!env").matches(&labels(&[("env", "x")])));
    }

    #[test]
    fn conjunction() {
        let sel = ls("app=web,!canary,tier in (fe)");
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "fe")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "fe"), ("canary", "1")])));
        assert!(!sel.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "a",
            "!a",
            "a=b",
            "a==b",
            "a!=b",
            "a in (x, y,)",
            "a notin ()",
            "kubevirt.io/domain=vm1,!kubevirt.io/paused,gen>2,gen<9",
            "a=,b in (in)",
        ] {
            let sel = ls(s);
            assert_eq!(ls(&sel.to_string()), sel, "{s}");
        }
        for s in [r"a=x\,y", "a!=b,c==d", r"x=\=\\"] {
            let sel = fs(s);
            assert_eq!(fs(&sel.to_string()), sel, "{s}");
        }
    }

    #[test]
    fn numeric_comparisons() {
        let sel = ls("gen>3");
        assert!(sel.matches(&labels(&[("gen", "4")])));
        assert!(!sel.matches(&labels(&[("gen", "3")])));
        assert!(!sel.matches(&labels(&[("gen", "x")])));
        assert!(!sel.matches(&labels(&[])));
        assert!(ls("gen<3").matches(&labels(&[("gen", "-1")])));
        assert!(lerr("gen>x").contains("for 'Gt', 'Lt' operators, the value must be an integer"));
    }

    #[test]
    fn empty_values() {
        let sel = ls("a=");
        assert_eq!(sel.requirements()[0].values(), &[String::new()]);
        assert!(sel.matches(&labels(&[("a", "")])));
        assert!(ls("a=,b").matches(&labels(&[("a", ""), ("b", "x")])));
        assert_eq!(ls("a in ()").requirements()[0].values(), &[String::new()]);
        assert_eq!(
            ls("a in (x,)").requirements()[0].values(),
            &[String::new(), "x".to_string()]
        );
    }

    #[test]
    fn keywords_are_values_in_value_position() {
        let sel = ls("a in (in,notin),b=in");
        assert_eq!(sel.requirements()[0].values(), &["in", "notin"]);
        assert_eq!(sel.requirements()[1].values(), &["in"]);
    }

    #[test]
    fn prefixed_keys() {
        let sel = ls("kubevirt.io/domain=vm1,app.kubernetes.io/name in (x)");
        assert!(sel.matches(&labels(&[
            ("kubevirt.io/domain", "vm1"),
            ("app.kubernetes.io/name", "x")
        ])));
    }

    #[test]
    fn syntax_errors() {
        assert_eq!(
            lerr("a b"),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(lerr("a=b,"), "found '', expected: identifier after ','");
        assert_eq!(
            lerr("a in b"),
            "unable to parse requirement: found 'b', expected: '('"
        );
        assert_eq!(
            lerr("a in (b c)"),
            "unable to parse requirement: found 'c', expected: ',' or ')'"
        );
        assert_eq!(
            lerr("a in (b"),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
        assert_eq!(
            lerr("!"),
            "unable to parse requirement: found '', expected: identifier after '!'"
        );
        assert_eq!(
            lerr("a=(b)"),
            "unable to parse requirement: found '(', expected: identifier"
        );
        assert_eq!(
            lerr("a!b"),
            "unable to parse requirement: found '!', expected: in, notin, =, ==, !=, gt, lt"
        );
        assert_eq!(
            lerr(",a"),
            "found ',', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(lerr("!a=b"), "found '=', expected: ',' or 'end of string'");
    }

    #[test]
    fn invalid_keys_and_values() {
        assert_eq!(
            lerr("-a=b"),
            format!("unable to parse requirement: key: Invalid value: \"-a\": {NAME_FMT_HINT}")
        );
        assert_eq!(lerr("a=b c"), "found 'c', expected: ',' or 'end of string'");
        assert_eq!(
            lerr("a=-b"),
            format!(
                "unable to parse requirement: values[0][a]: Invalid value: \"-b\": {LABEL_VALUE_HINT}"
            )
        );
        assert!(lerr("Example.com/a=b").contains("prefix part a lowercase RFC 1123 subdomain"));
        assert!(lerr("/a").contains("prefix part must be non-empty"));
        assert!(lerr("a/b/c").contains("a qualified name must consist of"));
        assert!(lerr(&format!("{}=x", "k".repeat(64))).contains("no more than 63 characters"));
        assert!(
            lerr(&format!("k={}", "v".repeat(64))).contains("must be no more than 63 characters")
        );
        assert!(ls(&format!("{}=x", "k".repeat(63))).matches(&labels(&[(&"k".repeat(63), "x")])));
    }

    #[test]
    fn matches_object_reads_metadata_labels() {
        let obj = serde_json::json!({"metadata": {"labels": {"app": "web"}}});
        assert!(ls("app=web").matches_object(&obj));
        assert!(!ls("app=db").matches_object(&obj));
        assert!(ls("!app").matches_object(&serde_json::json!({"metadata": {}})));
    }

    #[test]
    fn label_sar_attributes() {
        let attrs = ls("a=1,b!=2,c,!d,e in (x,y),f>3").to_sar_attributes();
        let reqs = attrs.requirements.unwrap_or_default();
        let got: Vec<(String, String, Option<Vec<String>>)> = reqs
            .into_iter()
            .map(|r| (r.key, r.operator, r.values))
            .collect();
        let v = |s: &[&str]| Some(s.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            got,
            vec![
                ("a".into(), "In".into(), v(&["1"])),
                ("b".into(), "NotIn".into(), v(&["2"])),
                ("c".into(), "Exists".into(), None),
                ("d".into(), "DoesNotExist".into(), None),
                ("e".into(), "In".into(), v(&["x", "y"])),
            ]
        );
    }

    fn fs(s: &str) -> FieldSelector {
        FieldSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn field_selector_parsing() {
        let sel = fs("metadata.name=vm1,status.phase!=Running,metadata.namespace==default");
        let got: Vec<_> = sel
            .requirements()
            .iter()
            .map(|r| (r.field(), r.operator(), r.value()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("metadata.name", FieldOperator::Equals, "vm1"),
                ("status.phase", FieldOperator::NotEquals, "Running"),
                ("metadata.namespace", FieldOperator::Equals, "default"),
            ]
        );
        assert_eq!(
            sel.fields().into_iter().collect::<Vec<_>>(),
            vec!["metadata.name", "metadata.namespace", "status.phase"]
        );
        assert!(fs("").is_empty());
        assert!(fs(",").is_empty());
        assert_eq!(fs("a=").requirements()[0].value(), "");
    }

    #[test]
    fn field_selector_escapes() {
        let sel = fs(r"a=x\,y\=z\\w,b!=1");
        assert_eq!(sel.requirements()[0].value(), r"x,y=z\w");
        assert_eq!(sel.requirements()[1].value(), "1");
        assert_eq!(sel.to_string(), r"a=x\,y\=z\\w,b!=1");
        assert_eq!(fs(&sel.to_string()), sel);
        assert_eq!(
            FieldSelector::parse(r"a=\q").map_err(|e| e.to_string()),
            Err(r"invalid field selector: invalid escape sequence: \q".to_string())
        );
        assert_eq!(
            FieldSelector::parse("a=b=c").map_err(|e| e.to_string()),
            Err("invalid field selector: unescaped character in value: =".to_string())
        );
        assert_eq!(
            FieldSelector::parse("a=b,c").map_err(|e| e.to_string()),
            Err("invalid selector: 'a=b,c'; can't understand 'c'".to_string())
        );
    }

    #[test]
    fn field_selector_matching() {
        let obj = serde_json::json!({
            "metadata": {"name": "vm1", "namespace": "d"},
            "status": {"phase": "Running", "ready": true, "count": 3}
        });
        assert!(fs("metadata.name=vm1,metadata.namespace=d").matches_object(&obj));
        assert!(!fs("metadata.name=vm2").matches_object(&obj));
        assert!(fs("status.phase!=Failed").matches_object(&obj));
        assert!(fs("status.ready=true,status.count=3").matches_object(&obj));
        // Missing fields compare as the empty string.
        assert!(fs("status.nodeName=").matches_object(&obj));
        assert!(fs("status.nodeName!=n1").matches_object(&obj));
        assert!(!fs("status.nodeName=n1").matches_object(&obj));
        assert!(fs("").matches_object(&obj));
    }

    #[test]
    fn field_selector_support_check() {
        let sel = fs("metadata.name=a,spec.foo=b");
        assert!(sel.check_supported(&["metadata.name", "spec.foo"]).is_ok());
        assert_eq!(
            sel.check_supported(&["metadata.name"])
                .map_err(|e| e.to_string()),
            Err("field label not supported: spec.foo".to_string())
        );
        assert_eq!(sel.required_value("metadata.name"), Some("a"));
        assert_eq!(fs("metadata.name!=a").required_value("metadata.name"), None);
    }

    #[test]
    fn field_sar_attributes() {
        let attrs = fs("a=1,b!=2").to_sar_attributes();
        let reqs = attrs.requirements.unwrap_or_default();
        assert_eq!(reqs.len(), 2);
        assert_eq!(
            (reqs[0].operator.as_str(), reqs[1].operator.as_str()),
            ("In", "NotIn")
        );
        assert!(
            FieldSelector::everything()
                .to_sar_attributes()
                .requirements
                .is_none()
        );
    }
}
