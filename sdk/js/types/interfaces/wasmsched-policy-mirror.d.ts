/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/mirror@0.2.0' {
  /**
   * Forget every node and size the table to `slots` empty entries.
   */
  export function reset(generation: bigint, slots: number): void;
  /**
   * Insert or replace nodes at the given slots.
   */
  export function upsert(generation: bigint, nodes: Array<[number, Node]>): void;
  /**
   * Empty the given slots.
   */
  export function remove(generation: bigint, slots: Uint32Array): void;
  export type Node = import('wasmsched:policy/types@0.2.0').Node;
}
