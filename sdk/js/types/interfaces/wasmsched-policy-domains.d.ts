declare module 'wasmsched:policy/domains@0.2.0' {
  /**
   * The levels' node labels, innermost first; empty when the host has none configured.
   */
  export function levels(): Array<string>;
  /**
   * The domain of level `level` (an index into `levels`) named `name`: a node's domain at a
   * level is named by its values of that level's label and every label outward, innermost
   * first, joined by `/`, a missing outer value empty and trailing empties dropped (the SDK's
   * `domains::Lookup` does it). None when no node is in such a domain. Ask once per distinct
   * domain among a call's candidates, not once per node.
   */
  export function domainNamed(level: number, name: string): Domain | undefined;
  /**
   * One domain of one level.
   */
  export interface Domain {
    /**
     * Its label values, innermost first, joined by `/` (e.g. `nvl72.3/block-1`).
     */
    name: string,
    nodes: number,
    /**
     * Of its nodes, those with nothing allocated.
     */
    idleNodes: number,
    /**
     * GPU share of its usable devices, in milli-GPUs.
     */
    gpuMilli: bigint,
    /**
     * Of it, unallocated.
     */
    freeGpuMilli: bigint,
  }
}
