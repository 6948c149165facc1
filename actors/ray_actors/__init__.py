"""kvres.actors.ray_actors."""
