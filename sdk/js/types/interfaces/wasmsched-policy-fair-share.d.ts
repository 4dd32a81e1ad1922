/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/fair-share@0.2.0' {
  /**
   * `cluster` is what the queues may share: the nodes' allocatable total, less the reserves
   * lending limits keep for queues that do not ask for them (no other queue may take those).
   */
  export function compute(queues: Array<QueueState>, cluster: Resources): ShareDecision;
  export type Resources = import('wasmsched:policy/types@0.2.0').Resources;
  export interface QueueState {
    name: string,
    /**
     * Index of the parent queue in the list, none for a root.
     */
    parent?: number,
    weight: number,
    guarantee: Resources,
    /**
     * Upper bound of the queue's allocation, none for unbounded. It bounds only the extended
     * resources it names: one it does not name is unbounded (as in the host's quota checks).
     */
    capability?: Resources,
    allocated: Resources,
    /**
     * Allocated plus pending requests.
     */
    request: Resources,
    /**
     * Past usage in GPU-milli-seconds, decayed by the host's half-life.
     */
    decayedUsage: number,
    reclaimable: boolean,
  }
  export interface ShareDecision {
    /**
     * Deserved share per queue, in input order.
     */
    deserved: Array<Resources>,
    /**
     * Queue indexes in the order they should be served; queues left out get nothing this cycle.
     */
    order: Uint32Array,
  }
}
