/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/mirror-usage@0.2.0' {
  /**
   * Replace the usage of the nodes at the given slots. An error (a slot the mirror does not
   * hold, another device count) makes the host resend the whole mirror.
   */
  export function updateUsage(generation: bigint, nodes: Array<[number, NodeUsage]>): void;
  export type Resources = import('wasmsched:policy/types@0.2.0').Resources;
  /**
   * A device's usage, in the order of `node.gpus`.
   */
  export interface GpuUsage {
    freeMilli: number,
    freeMemoryBytes: bigint,
  }
  /**
   * A node's usage.
   */
  export interface NodeUsage {
    allocated: Resources,
    /**
     * One per device of the mirrored node, in the same order.
     */
    gpus: Array<GpuUsage>,
  }
}
