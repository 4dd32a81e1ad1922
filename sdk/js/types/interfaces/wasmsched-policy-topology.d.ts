declare module 'wasmsched:policy/topology@0.2.0' {
  /**
   * The best `count` GPUs among `free` (bit i = GPU i) on the node named `node`: the host's exact
   * selection. None: the host knows no topology for that node. An error: no set satisfies the
   * policy, with the reason.
   */
  export function bestGpus(node: string, count: number, policy: NumaPolicy, free: bigint): Result<GpuSet, string> | undefined;
  /**
   * The link between GPUs `a` and `b` of `node`; none when unknown.
   */
  export function link(node: string, a: number, b: number): GpuLink | undefined;
  /**
   * NUMA alignment, with the Kubernetes Topology Manager's meaning.
   * # Variants
   * 
   * ## `"none"`
   * 
   * ## `"best-effort"`
   * 
   * ## `"restricted"`
   * 
   * ## `"single-numa-node"`
   */
  export type NumaPolicy = 'none' | 'best-effort' | 'restricted' | 'single-numa-node';
  /**
   * A chosen set of GPUs and the values it was chosen by.
   */
  export interface GpuSet {
    /**
     * GPU indexes, ascending.
     */
    gpus: Uint32Array,
    /**
     * Slowest link inside the set in MB/s; none for a single GPU.
     */
    bottleneckMbps?: number,
    /**
     * Sum over pairs of latency normalised to one NVLink hop, in thousandths.
     */
    distanceMilli: bigint,
    /**
     * NUMA nodes the set touches.
     */
    numaSpan: number,
    /**
     * The host's node-level topology score for this set, 0..=100.
     */
    score: number,
  }
  /**
   * The link between two GPUs of a node.
   */
  export interface GpuLink {
    /**
     * The class as `nvidia-smi topo -m` prints it: `NV12`, `PIX`, `PXB`, `PHB`, `NODE`, `SYS`.
     */
    'class': string,
    /**
     * NVLink through an NVSwitch.
     */
    nvswitch: boolean,
    bandwidthMbps: number,
    /**
     * Latency normalised to one NVLink hop, in thousandths.
     */
    distanceMilli: number,
  }
  export type Result<T, E> = { tag: 'ok', val: T } | { tag: 'err', val: E };
}
