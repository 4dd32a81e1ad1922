/// <reference path="./wasmsched-policy-fair-share.d.ts" />
/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/fair-share-delta@0.2.0' {
  /**
   * `reset`: forget earlier states and answers; `changed` then holds every queue. `count`: the
   * number of queues (a smaller count drops the last ones). `changed`: new states by index,
   * ascending, each below `count`. `cluster` as in `fair-share.compute`. A guest that does not
   * hold every queue answers an error (the host resets it on its next call).
   */
  export function computeChanged(reset: boolean, count: number, changed: Array<[number, QueueState]>, cluster: Resources): ShareDelta;
  export type Resources = import('wasmsched:policy/types@0.2.0').Resources;
  export type QueueState = import('wasmsched:policy/fair-share@0.2.0').QueueState;
  export interface ShareDelta {
    /**
     * Deserved shares that differ from the previous answer (every one after a reset), by
     * queue index, ascending.
     */
    deserved: Array<[number, Resources]>,
    /**
     * Queue indexes in the order they should be served, in full.
     */
    order: Uint32Array,
  }
}
