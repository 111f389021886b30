"""What a run is made of: recipes, cluster profiles, overrides, resolved into one frozen RunSpec; and the plain
data the spec is checked against (the reward and eval-task registries, verl's key tables)."""
