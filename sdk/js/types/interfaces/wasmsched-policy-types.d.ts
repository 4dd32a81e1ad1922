declare module 'wasmsched:policy/types@0.2.0' {
  /**
   * An amount of schedulable resources.
   */
  export interface Resources {
    cpuMilli: bigint,
    memoryBytes: bigint,
    /**
     * Total GPU capacity in milli-GPUs (used by queues and fair share; per-device state is in
     * `gpu-device`).
     */
    gpuMilli: bigint,
    /**
     * Extended resources such as `rdma/hca`, sorted by name, each name at most once.
     */
    extended: Array<[string, bigint]>,
  }
  /**
   * # Variants
   * 
   * ## `"healthy"`
   * 
   * ## `"degraded"`
   * 
   * ## `"unhealthy"`
   */
  export type GpuHealth = 'healthy' | 'degraded' | 'unhealthy';
  /**
   * One GPU device on a node.
   */
  export interface GpuDevice {
    /**
     * Index of the device on its node (the `nvidia-smi` index).
     */
    index: number,
    /**
     * Model name, e.g. `A100-SXM4-80GB` or the openb short form `V100M32`.
     */
    model: string,
    memoryBytes: bigint,
    /**
     * Unallocated share in milli-GPUs: 1000 means the device is entirely free.
     */
    freeMilli: number,
    freeMemoryBytes: bigint,
    health: GpuHealth,
    /**
     * NUMA node the device is attached to, if known.
     */
    numaNode?: number,
  }
  /**
   * # Variants
   * 
   * ## `"no-schedule"`
   * 
   * ## `"prefer-no-schedule"`
   * 
   * ## `"no-execute"`
   */
  export type TaintEffect = 'no-schedule' | 'prefer-no-schedule' | 'no-execute';
  export interface Taint {
    key: string,
    value: string,
    effect: TaintEffect,
  }
  /**
   * A node as policies see it. `allocated` is what bound and reserved tasks request.
   */
  export interface Node {
    name: string,
    labels: Array<[string, string]>,
    taints: Array<Taint>,
    allocatable: Resources,
    allocated: Resources,
    gpus: Array<GpuDevice>,
    /**
     * Cordoned: no new work may be placed.
     */
    unschedulable: boolean,
  }
  /**
   * # Variants
   * 
   * ## `"equal"`
   * 
   * ## `"exists"`
   */
  export type TolerationOperator = 'equal' | 'exists';
  export interface Toleration {
    /**
     * Empty with `exists` tolerates every taint.
     */
    key: string,
    operator: TolerationOperator,
    value: string,
    /**
     * None tolerates every effect.
     */
    effect?: TaintEffect,
  }
  /**
   * # Variants
   * 
   * ## `"guaranteed"`
   * 
   * ## `"burstable"`
   * 
   * ## `"best-effort"`
   */
  export type Qos = 'guaranteed' | 'burstable' | 'best-effort';
  /**
   * How a node-affinity requirement compares a node's label (Kubernetes `NodeSelectorOperator`).
   * # Variants
   * 
   * ## `"in"`
   * 
   * ## `"not-in"`
   * 
   * ## `"exists"`
   * 
   * ## `"does-not-exist"`
   * 
   * ## `"gt"`
   * 
   * ## `"lt"`
   */
  export type SelectorOperator = 'in' | 'not-in' | 'exists' | 'does-not-exist' | 'gt' | 'lt';
  /**
   * One requirement on a node label (or, in `match-fields`, on the node's name).
   */
  export interface SelectorRequirement {
    key: string,
    operator: SelectorOperator,
    /**
     * `in` / `not-in`: one or more values, sorted ascending without duplicates (sets: the host sorts them); `gt` / `lt`: one integer; otherwise empty.
     */
    values: Array<string>,
  }
  /**
   * All requirements hold. A term with no requirement matches no node, as in Kubernetes.
   */
  export interface NodeSelectorTerm {
    matchExpressions: Array<SelectorRequirement>,
    /**
     * Only the key `metadata.name`, with `in` or `not-in`.
     */
    matchFields: Array<SelectorRequirement>,
  }
  /**
   * A preferred term and its weight (1..=100).
   */
  export interface PreferredTerm {
    weight: number,
    preference: NodeSelectorTerm,
  }
  /**
   * Kubernetes node affinity (the `IgnoredDuringExecution` kinds: checked at placement only).
   */
  export interface NodeAffinity {
    /**
     * The node must match at least one term; empty means no requirement.
     */
    required: Array<NodeSelectorTerm>,
    /**
     * Scores may prefer nodes matching these.
     */
    preferred: Array<PreferredTerm>,
  }
  /**
   * What a task asks of GPUs. `count` whole devices with `milli-per-gpu` = 1000, or one shared
   * device with `count` = 1 and `milli-per-gpu` < 1000. `count` = 0 asks for no GPU.
   */
  export interface GpuRequest {
    count: number,
    milliPerGpu: number,
    /**
     * GPU memory needed on each device (0 = no constraint).
     */
    memoryBytesPerGpu: bigint,
    /**
     * Allowed GPU models; empty allows any.
     */
    models: Array<string>,
  }
  /**
   * One schedulable unit (a pod, or a member of a gang).
   */
  export interface Task {
    id: string,
    namespace: string,
    /**
     * The pod group this task belongs to, if any.
     */
    group?: string,
    queue: string,
    priority: number,
    qos: Qos,
    /**
     * CPU, memory and extended resources; GPUs are in `gpu`.
     */
    request: Resources,
    gpu: GpuRequest,
    nodeSelector: Array<[string, string]>,
    nodeAffinity: NodeAffinity,
    tolerations: Array<Toleration>,
  }
  /**
   * A rejection reason. `unresolvable` says preemption cannot help (kube-scheduler's
   * UnschedulableAndUnresolvable), e.g. a node-selector mismatch.
   */
  export interface Rejection {
    reason: string,
    unresolvable: boolean,
  }
  /**
   * The stages a plugin may implement.
   * # Variants
   * 
   * ## `"filter"`
   * 
   * ## `"score"`
   * 
   * ## `"preempt"`
   * 
   * ## `"fair-share"`
   * 
   * ## `"select-devices"`
   */
  export type Stage = 'filter' | 'score' | 'preempt' | 'fair-share' | 'select-devices';
}
