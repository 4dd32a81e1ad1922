//! CEL device selectors (`device.driver`, `device.attributes[...]`, `device.capacity[...]`), with
//! Kubernetes' semantics where plain CEL differs: a domain a device does not have reads as an empty
//! map, capacities are quantities, version attributes are semantic versions, and an expression is
//! bounded in size, nesting and estimated cost before it is ever run.
//!
//! Evaluated with the `cel` crate. Each expression is compiled once ([`Selectors`] caches it, the
//! error too); each device's CEL value is built once ([`DeviceValue`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use cel::common::ast::Expr;
use cel::objects::{Opaque, Value};
use cel::{Context, ExecutionError, FunctionContext, Program};

use crate::inventory::{Attribute, Device};
use crate::quantity::Quantity;

/// The longest selector Kubernetes stores (`CELSelectorExpressionMaxLength`).
pub const MAX_LENGTH: usize = 10 * 1024;
/// The most a selector may cost by static estimate (`CELSelectorExpressionMaxCost`).
pub const MAX_COST: u64 = 1_000_000;
/// The deepest expression tree accepted: deeper ones would overflow the evaluator's stack.
pub const MAX_DEPTH: usize = 100;
/// The iterations assumed for a comprehension over a device's maps (a device has at most 32
/// attributes and capacities).
const ITERATIONS: u64 = 32;

/// Why a selector could not be used: each is a reason shown on the pod, never a panic.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// Over [`MAX_LENGTH`] bytes.
    #[error("CEL selector is {0} bytes, over the limit of {MAX_LENGTH}")]
    TooLong(usize),
    /// Not valid CEL.
    #[error("CEL selector {expression:?} does not compile: {message}")]
    Compile {
        /// The expression.
        expression: String,
        /// The parser's message.
        message: String,
    },
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("CEL selector {expression:?} is nested deeper than {MAX_DEPTH} levels")]
    TooDeep {
        /// The expression.
        expression: String,
    },
    /// Estimated to cost more than [`MAX_COST`].
    #[error("CEL selector {expression:?} has an estimated cost of {estimate}, over the limit of {MAX_COST}")]
    TooCostly {
        /// The expression.
        expression: String,
        /// The estimate.
        estimate: u64,
    },
    /// Failed on a device.
    #[error("CEL selector {expression:?} failed on device {device}: {message}")]
    Runtime {
        /// The expression.
        expression: String,
        /// The device.
        device: String,
        /// The evaluator's message.
        message: String,
    },
    /// Did not give a boolean.
    #[error("CEL selector {expression:?} gave {value} on device {device}, not a boolean")]
    NotBoolean {
        /// The expression.
        expression: String,
        /// The device.
        device: String,
        /// What it gave.
        value: String,
    },
}

/// A compiled selector.
pub struct Selector {
    expression: String,
    program: Program,
    /// Attribute and capacity domains the expression names literally, so a device without one can
    /// be given an empty map for it (Kubernetes' semantics) instead of failing.
    domains: BTreeSet<String>,
    /// Everything the expression reads of a device, when it reads only named fields (`None`: it
    /// reads the device, or one of its maps, as a whole). Two devices that agree on these get the
    /// same verdict, so a cluster of identical GPUs evaluates it a handful of times, not per GPU.
    footprint: Option<Vec<Read>>,
}

/// One thing a selector reads of a device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Read {
    /// `device.driver`.
    Driver,
    /// `device.attributes['domain'].id`, by its qualified name.
    Attribute(String),
    /// `device.capacity['domain'].id`, by its qualified name.
    Capacity(String),
    /// Whether the device has the domain (a missing one reads as an empty map).
    Domain(String),
}

/// The values of a selector's footprint on one device.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seen {
    /// A string (the driver).
    Text(String),
    /// An attribute's value.
    Attribute(Attribute),
    /// A capacity.
    Quantity(Quantity),
    /// Absent.
    Missing,
    /// A domain is there, or not.
    Present(bool),
}

/// [`Seen`], borrowed from the device: a footprint is hashed and compared in this form, and made
/// owned only the first time it is seen.
#[derive(Hash)]
enum SeenRef<'d> {
    Text(&'d str),
    Attribute(&'d Attribute),
    Quantity(Quantity),
    Missing,
    Present(bool),
}

impl SeenRef<'_> {
    fn is(&self, owned: &Seen) -> bool {
        match (self, owned) {
            (SeenRef::Text(a), Seen::Text(b)) => *a == b,
            (SeenRef::Attribute(a), Seen::Attribute(b)) => *a == b,
            (SeenRef::Quantity(a), Seen::Quantity(b)) => a == b,
            (SeenRef::Missing, Seen::Missing) => true,
            (SeenRef::Present(a), Seen::Present(b)) => a == b,
            _ => false,
        }
    }

    fn to_owned(&self) -> Seen {
        match self {
            SeenRef::Text(s) => Seen::Text(s.to_string()),
            SeenRef::Attribute(a) => Seen::Attribute((*a).clone()),
            SeenRef::Quantity(q) => Seen::Quantity(*q),
            SeenRef::Missing => Seen::Missing,
            SeenRef::Present(b) => Seen::Present(*b),
        }
    }
}

/// One selector's verdicts by footprint ([`Selector::seen`]): a device whose footprint is known
/// gets its verdict without an evaluation. Looked up once per (selector, device), so the lookup
/// builds nothing: the footprint is hashed and compared as the device shows it (building it
/// owned, with its strings, was most of a cold allocation: `wasmsched bench --dra`).
#[derive(Default)]
pub struct Footprints {
    state: ahash::RandomState,
    /// By the footprint's hash, the footprints with that hash and their verdicts.
    known: ahash::AHashMap<u64, Vec<(Vec<Seen>, bool)>>,
}

impl Footprints {
    /// The verdict of `selector` on devices showing it what `device` shows; `None` when not known
    /// yet, or when the selector reads more than named fields.
    pub fn verdict(&self, selector: &Selector, device: &Device) -> Option<bool> {
        let hash = self.hash(selector, device)?;
        let same = |owned: &[Seen]| {
            let mut view = selector.view(device).into_iter().flatten();
            owned.iter().all(|o| view.next().is_some_and(|s| s.is(o))) && view.next().is_none()
        };
        self.known.get(&hash)?.iter().find(|(owned, _)| same(owned)).map(|(_, v)| *v)
    }

    /// Remember `verdict` for the footprint `device` shows `selector`.
    pub fn learn(&mut self, selector: &Selector, device: &Device, verdict: bool) {
        let (Some(hash), Some(owned)) = (self.hash(selector, device), selector.seen(device)) else { return };
        self.known.entry(hash).or_default().push((owned, verdict));
    }

    fn hash(&self, selector: &Selector, device: &Device) -> Option<u64> {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut hasher = self.state.build_hasher();
        for s in selector.view(device)? {
            s.hash(&mut hasher);
        }
        Some(hasher.finish())
    }
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector").field("expression", &self.expression).finish()
    }
}

impl Selector {
    /// Check and compile `expression`.
    pub fn compile(expression: &str) -> Result<Selector, SelectorError> {
        if expression.len() > MAX_LENGTH {
            return Err(SelectorError::TooLong(expression.len()));
        }
        let source = expression.to_string();
        // The parser recurses per nesting level: on a thread with a stack that any expression
        // within the length limit fits, so a hostile one cannot overflow the caller's.
        let parsed = std::thread::Builder::new()
            .name("cel-compile".into())
            .stack_size(256 << 20)
            .spawn(move || {
                let program = Program::compile(&source).map_err(|e| e.to_string())?;
                let depth = depth(program.expression());
                let estimate = cost(program.expression(), 1);
                let mut domains = BTreeSet::new();
                collect_domains(program.expression(), &mut domains);
                let footprint = footprint(program.expression(), &domains);
                Ok::<_, String>((program, depth, estimate, domains, footprint))
            })
            .map_err(|e| SelectorError::Compile { expression: expression.into(), message: e.to_string() })?
            .join();
        let (program, depth, estimate, domains, footprint) = match parsed {
            Ok(Ok(p)) => p,
            Ok(Err(message)) => return Err(SelectorError::Compile { expression: expression.into(), message }),
            Err(_) => {
                return Err(SelectorError::Compile {
                    expression: expression.into(),
                    message: "the parser failed".into(),
                });
            }
        };
        if depth > MAX_DEPTH {
            return Err(SelectorError::TooDeep { expression: expression.into() });
        }
        if estimate > MAX_COST {
            return Err(SelectorError::TooCostly { expression: expression.into(), estimate });
        }
        Ok(Selector { expression: expression.to_string(), program, domains, footprint })
    }

    /// What the expression reads of `device`, when it reads only named fields: devices that
    /// show it the same values get the same verdict (`None`: no such promise).
    pub fn seen(&self, device: &Device) -> Option<Vec<Seen>> {
        Some(self.view(device)?.map(|s| s.to_owned()).collect())
    }

    /// [`Selector::seen`], borrowed from the device.
    fn view<'d>(&'d self, device: &'d Device) -> Option<impl Iterator<Item = SeenRef<'d>> + 'd> {
        let reads = self.footprint.as_ref()?;
        Some(reads.iter().map(move |r| match r {
            Read::Driver => SeenRef::Text(&device.id.driver),
            Read::Attribute(name) => device.attributes.get(name).map_or(SeenRef::Missing, SeenRef::Attribute),
            Read::Capacity(name) => device.capacity.get(name).copied().map_or(SeenRef::Missing, SeenRef::Quantity),
            Read::Domain(d) => SeenRef::Present(device.domains.contains(d)),
        }))
    }

    /// The source text.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Whether `device` satisfies the selector.
    pub fn matches(&self, env: &Environment, device: &DeviceValue) -> Result<bool, SelectorError> {
        let mut scope = env.root.new_inner_scope();
        let missing: Vec<&String> = self.domains.iter().filter(|d| !device.domains.contains(*d)).collect();
        let value = if missing.is_empty() { device.value.clone() } else { device.build(&missing) };
        scope.add_variable_from_value("device", value);
        let runtime = |message: String| SelectorError::Runtime {
            expression: self.expression.clone(),
            device: device.id.clone(),
            message,
        };
        match self.program.execute(&scope) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(SelectorError::NotBoolean {
                expression: self.expression.clone(),
                device: device.id.clone(),
                value: format!("{other:?}"),
            }),
            Err(e) => Err(runtime(e.to_string())),
        }
    }
}

/// Every expression compiled once, failures included (a bad expression is reported the same way
/// each time without compiling it again).
#[derive(Default)]
pub struct Selectors {
    /// Looked up once per request of every claim prepared: ahash, not SipHash.
    compiled: ahash::AHashMap<String, Result<Arc<Selector>, SelectorError>>,
}

impl Selectors {
    /// The compiled selector for `expression`.
    pub fn get(&mut self, expression: &str) -> Result<Arc<Selector>, SelectorError> {
        if let Some(found) = self.compiled.get(expression) {
            return found.clone();
        }
        let compiled = Selector::compile(expression).map(Arc::new);
        self.compiled.insert(expression.to_string(), compiled.clone());
        compiled
    }
}

/// The CEL environment: the standard library plus Kubernetes' quantity and semver functions.
pub struct Environment {
    root: Context<'static>,
}

impl Default for Environment {
    fn default() -> Environment {
        let mut root = Context::default();
        root.add_function("quantity", |ftx: &FunctionContext, s: Arc<String>| -> cel::ResolveResult {
            Quantity::parse(&s).map(quantity_value).map_err(|e| ftx.error(e))
        });
        root.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok());
        root.add_function("semver", |ftx: &FunctionContext, s: Arc<String>| -> cel::ResolveResult {
            semver::Version::parse(&s).map(version_value).map_err(|e| ftx.error(e))
        });
        root.add_function("isSemver", |s: Arc<String>| semver::Version::parse(&s).is_ok());
        root.add_function("compareTo", |ftx: &FunctionContext, This(this): This<Value>, other: Value| {
            compare(ftx, &this, &other).map(|o| o as i64)
        });
        root.add_function("isGreaterThan", |ftx: &FunctionContext, This(this): This<Value>, other: Value| {
            compare(ftx, &this, &other).map(|o| o.is_gt())
        });
        root.add_function("isLessThan", |ftx: &FunctionContext, This(this): This<Value>, other: Value| {
            compare(ftx, &this, &other).map(|o| o.is_lt())
        });
        root.add_function("asInteger", |ftx: &FunctionContext, This(this): This<Value>| {
            quantity_of(ftx, &this)?.as_integer().ok_or_else(|| ftx.error("the quantity is not an integer in range"))
        });
        root.add_function("isInteger", |ftx: &FunctionContext, This(this): This<Value>| {
            quantity_of(ftx, &this).map(|q| q.as_integer().is_some())
        });
        root.add_function("asApproximateFloat", |ftx: &FunctionContext, This(this): This<Value>| {
            quantity_of(ftx, &this).map(Quantity::as_f64)
        });
        root.add_function("sign", |ftx: &FunctionContext, This(this): This<Value>| {
            quantity_of(ftx, &this).map(|q| q.0.signum() as i64)
        });
        root.add_function("major", |ftx: &FunctionContext, This(this): This<Value>| {
            version_of(ftx, &this).map(|v| v.major as i64)
        });
        root.add_function("minor", |ftx: &FunctionContext, This(this): This<Value>| {
            version_of(ftx, &this).map(|v| v.minor as i64)
        });
        root.add_function("patch", |ftx: &FunctionContext, This(this): This<Value>| {
            version_of(ftx, &this).map(|v| v.patch as i64)
        });
        Environment { root }
    }
}

use cel::extractors::This;

/// A quantity inside CEL.
#[derive(Debug, PartialEq, Eq)]
struct CelQuantity(Quantity);
impl Opaque for CelQuantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A semantic version inside CEL.
#[derive(Debug, PartialEq, Eq)]
struct CelVersion(semver::Version);
impl Opaque for CelVersion {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

fn quantity_value(q: Quantity) -> Value {
    Value::Opaque(Arc::new(CelQuantity(q)))
}

fn version_value(v: semver::Version) -> Value {
    Value::Opaque(Arc::new(CelVersion(v)))
}

fn quantity_of(ftx: &FunctionContext, v: &Value) -> Result<Quantity, ExecutionError> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<CelQuantity>().map(|q| q.0),
        _ => None,
    }
    .ok_or_else(|| ftx.error(format!("{v:?} is not a quantity")))
}

fn version_of(ftx: &FunctionContext, v: &Value) -> Result<semver::Version, ExecutionError> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<CelVersion>().map(|q| q.0.clone()),
        _ => None,
    }
    .ok_or_else(|| ftx.error(format!("{v:?} is not a semantic version")))
}

/// Quantities with quantities, versions with versions (semver precedence: build metadata ignored).
fn compare(ftx: &FunctionContext, a: &Value, b: &Value) -> Result<std::cmp::Ordering, ExecutionError> {
    if let (Ok(x), Ok(y)) = (quantity_of(ftx, a), quantity_of(ftx, b)) {
        return Ok(x.cmp(&y));
    }
    if let (Ok(x), Ok(y)) = (version_of(ftx, a), version_of(ftx, b)) {
        return Ok(x.cmp_precedence(&y));
    }
    Err(ftx.error(format!("cannot compare {a:?} with {b:?}: both must be quantities or both versions")))
}

/// A device as CEL sees it, built once per device.
#[derive(Clone)]
pub struct DeviceValue {
    id: String,
    driver: String,
    attributes: HashMap<String, HashMap<String, Value>>,
    capacity: HashMap<String, HashMap<String, Value>>,
    domains: BTreeSet<String>,
    value: Value,
}

impl DeviceValue {
    /// `device.driver`, `device.attributes[domain][id]`, `device.capacity[domain][id]`.
    pub fn new(device: &Device) -> DeviceValue {
        let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, a) in &device.attributes {
            let (domain, id) = name.rsplit_once('/').unwrap_or(("", name));
            let value = match a {
                Attribute::Bool(b) => Value::Bool(*b),
                Attribute::Int(i) => Value::Int(*i),
                Attribute::String(s) => Value::String(Arc::new(s.clone())),
                Attribute::Version(v) => version_value(v.clone()),
            };
            attributes.entry(domain.to_string()).or_default().insert(id.to_string(), value);
        }
        let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, q) in &device.capacity {
            let (domain, id) = name.rsplit_once('/').unwrap_or(("", name));
            capacity.entry(domain.to_string()).or_default().insert(id.to_string(), quantity_value(*q));
        }
        let domains = attributes.keys().chain(capacity.keys()).cloned().collect();
        let mut d = DeviceValue {
            id: device.id.to_string(),
            driver: device.id.driver.to_string(),
            attributes,
            capacity,
            domains,
            value: Value::Null,
        };
        d.value = d.build(&[]);
        d
    }

    /// The value, with an empty map for each of `empty`'s domains the device does not have.
    fn build(&self, empty: &[&String]) -> Value {
        let with_empty = |maps: &HashMap<String, HashMap<String, Value>>| -> Value {
            let mut all: HashMap<String, Value> =
                maps.iter().map(|(domain, m)| (domain.clone(), Value::from(m.clone()))).collect();
            for d in empty {
                all.entry((*d).clone()).or_insert_with(|| Value::from(HashMap::<String, Value>::new()));
            }
            Value::from(all)
        };
        let mut device: HashMap<String, Value> = HashMap::new();
        device.insert("driver".into(), Value::String(Arc::new(self.driver.clone())));
        device.insert("attributes".into(), with_empty(&self.attributes));
        device.insert("capacity".into(), with_empty(&self.capacity));
        Value::from(device)
    }
}

/// The expression tree's depth, without recursion.
fn depth(root: &cel::IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(root, 1usize)];
    while let Some((e, d)) = stack.pop() {
        deepest = deepest.max(d);
        stack.extend(children(e).into_iter().map(|c| (c, d + 1)));
    }
    deepest
}

fn children(e: &cel::IdedExpr) -> Vec<&cel::IdedExpr> {
    match &e.expr {
        Expr::Call(c) => c.target.iter().map(|t| &**t).chain(c.args.iter()).collect(),
        Expr::Comprehension(c) => vec![&c.iter_range, &c.accu_init, &c.loop_cond, &c.loop_step, &c.result],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m.entries.iter().flat_map(entry_children).collect(),
        Expr::Select(s) => vec![&*s.operand],
        Expr::Struct(s) => s.entries.iter().flat_map(entry_children).collect(),
        _ => Vec::new(),
    }
}

fn entry_children(entry: &cel::common::ast::IdedEntryExpr) -> Vec<&cel::IdedExpr> {
    match &entry.expr {
        cel::common::ast::EntryExpr::MapEntry(e) => vec![&e.key, &e.value],
        cel::common::ast::EntryExpr::StructField(f) => vec![&f.value],
    }
}

/// A static cost estimate: one per node, a comprehension's body times the iterations its range can
/// have (a literal list's length, else a device map's bound), nested comprehensions multiplied.
fn cost(e: &cel::IdedExpr, times: u64) -> u64 {
    match &e.expr {
        Expr::Comprehension(c) => {
            let iterations = match &c.iter_range.expr {
                Expr::List(l) => l.elements.len() as u64,
                _ => ITERATIONS,
            };
            let inner = times.saturating_mul(iterations.max(1));
            times
                .saturating_add(cost(&c.iter_range, times))
                .saturating_add(cost(&c.accu_init, times))
                .saturating_add(cost(&c.loop_cond, inner))
                .saturating_add(cost(&c.loop_step, inner))
                .saturating_add(cost(&c.result, times))
        }
        _ => children(e).into_iter().fold(times, |total, c| total.saturating_add(cost(c, times))),
    }
}

/// The named fields `root` reads of `device`, or `None` when it uses `device` (or one of its
/// maps) in any other way. Domain presence is part of it: a missing domain reads as an empty map.
fn footprint(root: &cel::IdedExpr, domains: &BTreeSet<String>) -> Option<Vec<Read>> {
    let mut reads: Vec<Read> = domains.iter().map(|d| Read::Domain(d.clone())).collect();
    let mut stack = vec![root];
    while let Some(e) = stack.pop() {
        if let Some(read) = field_read(e) {
            if !reads.contains(&read) {
                reads.push(read);
            }
            continue;
        }
        if matches!(&e.expr, Expr::Ident(name) if name == "device") {
            return None;
        }
        stack.extend(children(e));
    }
    Some(reads)
}

/// `e` as a read of one named field: `device.driver`, or `device.attributes['d'].id` /
/// `device.attributes['d']['id']` (the same for `capacity`).
fn field_read(e: &cel::IdedExpr) -> Option<Read> {
    let is_device = |x: &cel::IdedExpr| matches!(&x.expr, Expr::Ident(n) if n == "device");
    let literal = |x: &cel::IdedExpr| match &x.expr {
        Expr::Literal(cel::common::ast::LiteralValue::String(s)) => Some(s.inner().to_string()),
        _ => None,
    };
    // The map of one domain: `device.attributes['d']`.
    let domain_map = |x: &cel::IdedExpr| -> Option<(bool, String)> {
        let Expr::Call(c) = &x.expr else { return None };
        let [map, key] = c.args.as_slice() else { return None };
        let Expr::Select(s) = &map.expr else { return None };
        if c.func_name != "_[_]" || !is_device(&s.operand) || s.test {
            return None;
        }
        let attributes = match s.field.as_str() {
            "attributes" => true,
            "capacity" => false,
            _ => return None,
        };
        Some((attributes, literal(key)?))
    };
    let (operand, id) = match &e.expr {
        Expr::Select(s) if s.field == "driver" && is_device(&s.operand) => return Some(Read::Driver),
        Expr::Select(s) => (&*s.operand, s.field.clone()),
        Expr::Call(c) if c.func_name == "_[_]" && c.args.len() == 2 => (&c.args[0], literal(&c.args[1])?),
        _ => return None,
    };
    let (attributes, domain) = domain_map(operand)?;
    let name = format!("{domain}/{id}");
    Some(if attributes { Read::Attribute(name) } else { Read::Capacity(name) })
}

/// Domains named as literal keys of `device.attributes` or `device.capacity`.
fn collect_domains(root: &cel::IdedExpr, out: &mut BTreeSet<String>) {
    let mut stack = vec![root];
    while let Some(e) = stack.pop() {
        if let Expr::Call(c) = &e.expr
            && c.func_name == "_[_]"
            && let [map, key] = c.args.as_slice()
            && let Expr::Select(s) = &map.expr
            && (s.field == "attributes" || s.field == "capacity")
            && let Expr::Ident(name) = &s.operand.expr
            && name == "device"
            && let Expr::Literal(cel::common::ast::LiteralValue::String(domain)) = &key.expr
        {
            out.insert(domain.inner().to_string());
        }
        stack.extend(children(e));
    }
}
