package model

import "github.com/tutti-io/tutti/kvshape"

// Geometry is the profile's shape, validated (a caller may have changed
// ChunkPages or PageTokens).
func (p Profile) Geometry() (kvshape.Geometry, error) {
	if err := p.Validate(); err != nil {
		return kvshape.Geometry{}, err
	}
	return p.Shape, nil
}

// MustGeometry is Geometry for the built-in profiles, which are valid.
func (p Profile) MustGeometry() kvshape.Geometry {
	g, err := p.Geometry()
	if err != nil {
		panic(err)
	}
	return g
}
