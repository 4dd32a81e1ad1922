/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/select-claim-devices@0.2.0' {
  /**
   * Indexes into `request.candidates`, most wanted first (each at most once).
   */
  export function rank(task: Task, node: number, request: ClaimRequest): Uint32Array;
  export type Task = import('wasmsched:policy/types@0.2.0').Task;
  /**
   * A typed attribute value, as a ResourceSlice publishes it.
   */
  export type AttributeValue = AttributeValueBoolean | AttributeValueInteger | AttributeValueText | AttributeValueVersion;
  export interface AttributeValueBoolean {
    tag: 'boolean',
    val: boolean,
  }
  export interface AttributeValueInteger {
    tag: 'integer',
    val: bigint,
  }
  export interface AttributeValueText {
    tag: 'text',
    val: string,
  }
  /**
   * A semantic version, as text.
   */
  export interface AttributeValueVersion {
    tag: 'version',
    val: string,
  }
  /**
   * A device the request may get: published on the node, accepted by the class's and the
   * request's selectors, tolerated, free.
   */
  export interface ClaimDevice {
    /**
     * `driver/pool/device`.
     */
    id: string,
    /**
     * Attributes by qualified name (`gpu.nvidia.com/index`, `resource.kubernetes.io/pcieRoot`).
     */
    attributes: Array<[string, AttributeValue]>,
    /**
     * Capacities by qualified name, as Kubernetes quantities (`80Gi`).
     */
    capacity: Array<[string, string]>,
  }
  /**
   * One request of a claim.
   */
  export interface ClaimRequest {
    /**
     * `request`, or `request/subrequest` for a `firstAvailable` alternative.
     */
    name: string,
    /**
     * Devices it takes.
     */
    count: number,
    /**
     * In the order the host would try them.
     */
    candidates: Array<ClaimDevice>,
  }
}
