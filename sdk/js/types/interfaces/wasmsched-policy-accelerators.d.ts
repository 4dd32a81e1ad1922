declare module 'wasmsched:policy/accelerators@0.2.0' {
  /**
   * The kinds the host knows besides NVIDIA's; fixed for the life of the host.
   */
  export function kinds(): Array<Kind>;
  /**
   * The kind of each of the named node's devices, by position in its `gpus` (empty string:
   * NVIDIA's); an empty list when every device is NVIDIA's or the node is unknown.
   */
  export function deviceKinds(node: string): Array<string>;
  /**
   * One kind besides NVIDIA's.
   */
  export interface Kind {
    /**
     * Its name (`amd`, `gaudi`, …), as `device-kinds` gives it.
     */
    name: string,
    /**
     * The extended resources a request of it names.
     */
    resources: Array<string>,
  }
}
