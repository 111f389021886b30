"""What a run is made of: recipes, cluster profiles, overrides, resolved into one frozen RunSpec."""
