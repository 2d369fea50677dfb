package model

import "github.com/tutti-io/tutti/objmap"

// Geometry is the profile's shape, validated (a caller may have changed
// ChunkPages or PageTokens).
func (p Profile) Geometry() (objmap.Geometry, error) {
	if err := p.Validate(); err != nil {
		return objmap.Geometry{}, err
	}
	return p.Shape, nil
}

// MustGeometry is Geometry for the built-in profiles, which are valid.
func (p Profile) MustGeometry() objmap.Geometry {
	g, err := p.Geometry()
	if err != nil {
		panic(err)
	}
	return g
}
